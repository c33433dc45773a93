"""A job no longer registered by its schedule's leader is retired, and comes back.

A promotion retires the job rows of its schedule that its registry lacks (a job removed
from the code, or renamed): they fire no more, and their history stays. A release that
registers the job again brings it back, history and all."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, Scheduler, every

from ..conftest import release
from .conftest import StartScheduler, runs, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _release(*job_ids: str) -> Scheduler:
    return release(*job_ids, trigger=every(seconds=10))


async def _retired(engine: AsyncEngine) -> dict[str, bool]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT id, retired_at IS NOT NULL FROM scheduler_jobs"))
        return {job_id: retired for job_id, retired in rows}


async def _lead(start_scheduler: StartScheduler, scheduler: Scheduler, clock: FakeClock) -> None:
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await scheduler.stop()


async def _old_release_ran(
    start_scheduler: StartScheduler, engine: AsyncEngine, clock: FakeClock
) -> None:
    """An older release, registering 'report' and 'old_report', led and ran each once."""
    first = await start_scheduler(_release("report", "old_report"), clock=clock)
    await first.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await wait_for_runs(engine, "old_report", 1)
    await first.stop()


async def test_a_job_the_promoted_leader_no_longer_registers_is_retired(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    await _lead(start_scheduler, _release("report", "old_report"), clock)
    await _lead(start_scheduler, _release("report"), clock)
    assert await _retired(engine) == {"report": False, "old_report": True}


async def test_a_retired_job_fires_no_more_and_keeps_its_history(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    await _old_release_ran(start_scheduler, engine, clock)
    second = await start_scheduler(_release("report"), clock=clock)
    await second.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await wait_for_runs(engine, "report", 2)
    assert len(await runs(engine, "old_report")) == 1


async def test_a_retired_job_registered_again_comes_back_with_its_history(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    await _old_release_ran(start_scheduler, engine, clock)
    await _lead(start_scheduler, _release("report"), clock)
    await _lead(start_scheduler, _release("report", "old_report"), clock)
    assert await _retired(engine) == {"report": False, "old_report": False}
    assert len(await runs(engine, "old_report")) == 1
