"""Run now runs now: the jitter spreads scheduled slots, not an operator's request."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from app.operations.jobs import run_job_now
from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ASKED_AT = T0 + timedelta(minutes=7)


async def _noop(ctx: JobContext) -> None:
    return None


def _jittered_job() -> Scheduler:
    """A daily job with a jitter of an hour, whose draw at ASKED_AT is over a minute."""
    for n in range(1000):
        scheduler = Scheduler()
        scheduler.job(every(days=1), id=f"daily_{n}", jitter=3600)(_noop)
        if scheduler.jobs[f"daily_{n}"].jitter_delay(ASKED_AT) > 60:
            return scheduler
    raise AssertionError("no job id draws over a minute")


async def test_run_now_fires_at_once_on_a_jittered_job(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = _jittered_job()
    job_id = next(iter(scheduler.jobs))
    clock = FakeClock(T0)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.set(ASKED_AT)
    await run_job_now(engine, job_id, lease_now=clock.now())
    # The clock stays at the moment the operator asked.
    history = await wait_for_runs(engine, job_id, 1, timeout=5)
    assert [status for status, _ in history] == ["ok"]
