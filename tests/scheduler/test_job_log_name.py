"""A job's and a service's own log lines (``ctx.log``) come from a logger named for
Regent and the job, whatever package the job lives in: never under ``app.jobs``, the
package of this repository's demo jobs."""

import asyncio
import logging

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, ServiceContext, every

from .conftest import StartScheduler, wait_for_runs


async def test_a_jobs_own_log_lines_come_from_regent_job_and_its_id(
    start_scheduler: StartScheduler, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    scheduler = Scheduler()

    @scheduler.job(every(seconds=1), id="welcome_mail")
    async def welcome(ctx: JobContext) -> None:
        ctx.log.info("sent")

    clock = FakeClock()
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(1)
    await wait_for_runs(engine, "welcome_mail", 1)
    [record] = [r for r in caplog.records if r.getMessage() == "sent"]
    assert record.name == "regent.job.welcome_mail"
    assert getattr(record, "job_id", None) == "welcome_mail"


async def test_a_services_own_log_lines_come_from_regent_service_and_its_id(
    start_scheduler: StartScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    scheduler = Scheduler()
    logged = asyncio.Event()

    @scheduler.service(id="long_poll")
    async def long_poll(ctx: ServiceContext) -> None:
        ctx.log.info("polling")
        logged.set()
        await asyncio.Event().wait()

    await start_scheduler(scheduler, clock=FakeClock())
    await asyncio.wait_for(logged.wait(), 10)
    [record] = [r for r in caplog.records if r.getMessage() == "polling"]
    assert record.name == "regent.service.long_poll"
    assert getattr(record, "job_id", None) == "long_poll"
