"""Jitter is a delay the schedule chose; it must not count against misfire_grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PERIOD = timedelta(hours=1)
JITTER = 600.0
GRACE = 60.0


async def _noop(ctx: JobContext) -> None:
    return None


def _job_with_a_long_draw() -> tuple[Scheduler, float]:
    """A job whose first slot draws a jitter delay well beyond the grace."""
    for n in range(1000):
        scheduler = Scheduler()
        scheduler.job(every(hours=1), id=f"jittered_{n}", jitter=JITTER, misfire_grace=GRACE)(_noop)
        spec = next(iter(scheduler.jobs.values()))
        delay = spec.jitter_delay(T0 + PERIOD)
        if delay > 2 * GRACE:
            return scheduler, delay
    raise AssertionError("no job id draws a delay beyond the grace")


async def test_a_jittered_slot_fired_on_its_own_jitter_is_run_not_missed(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler, delay = _job_with_a_long_draw()
    job_id = next(iter(scheduler.jobs))
    clock = FakeClock(T0)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    # Exactly when the job loop chose to fire the slot: nothing was late but the jitter.
    clock.set(T0 + PERIOD + timedelta(seconds=delay))
    history = await wait_for_runs(engine, job_id, 1)
    assert [status for status, _ in history] == ["ok"], (
        f"slot drew a jitter of {delay:.0f} s (jitter={JITTER:g}, misfire_grace={GRACE:g}) "
        f"and was fired on it; history: {history}"
    )
