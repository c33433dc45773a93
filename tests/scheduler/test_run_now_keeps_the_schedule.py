"""Run now is one extra run: the job's own slots stay where the schedule put them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.operations.jobs import run_job_now
from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _noop(ctx: JobContext) -> None:
    return None


async def test_run_now_on_an_interval_job_keeps_its_next_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(days=1), id="daily")(_noop)
    clock = FakeClock(T0)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(timedelta(hours=5))
    await run_job_now(engine, "daily", lease_now=clock.now())
    await wait_for_runs(engine, "daily", 1)
    async with engine.connect() as conn:
        next_run_at = (
            await conn.execute(text("SELECT next_run_at FROM scheduler_jobs WHERE id = 'daily'"))
        ).scalar_one()
    # The slot the schedule had set, one day after the row was created.
    assert next_run_at == T0 + timedelta(days=1)
