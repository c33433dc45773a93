"""Per-worker jobs (leader_only=False) tell the truth: their row shows the soonest
upcoming slot, lateness is measured from the jittered fire time (the jitter recorded
apart), pause stops them on every worker, and run-now is refused with a reason."""

import os
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin import queries
from app.admin.errors import Conflict
from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import StartScheduler, eventually, runs, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _sweep(jitter: float = 0) -> Scheduler:
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="sweep", leader_only=False, jitter=jitter)
    async def sweep(ctx: JobContext) -> None:
        return None

    return scheduler


async def _next_run_at(engine: AsyncEngine) -> datetime | None:
    async with engine.connect() as conn:
        query = text("SELECT next_run_at FROM scheduler_jobs WHERE id = 'sweep'")
        next_run_at: datetime | None = (await conn.execute(query)).scalar()
        return next_run_at


async def _next_run_is(engine: AsyncEngine, moment: datetime) -> None:
    async def there() -> bool:
        return await _next_run_at(engine) == moment

    await eventually(there, what=f"next_run_at {moment}")


async def test_a_replica_jobs_row_shows_its_next_upcoming_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    await start_scheduler(_sweep(), clock=clock)
    await _next_run_is(engine, T0 + MINUTE)
    await clock.wait_for_sleepers(2)
    clock.advance(60)
    await wait_for_runs(engine, "sweep", 1)
    await _next_run_is(engine, T0 + 2 * MINUTE)


async def test_replica_lateness_is_measured_from_the_jittered_fire_time(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = _sweep(jitter=30)
    await start_scheduler(scheduler, clock=clock)
    slot = T0 + MINUTE
    jitter = scheduler.jobs["sweep"].jitter_delay(slot, salt=str(os.getpid()))
    await _next_run_is(engine, slot)
    await clock.wait_for_sleepers(2)
    clock.set(slot + timedelta(seconds=jitter))
    await wait_for_runs(engine, "sweep", 1)
    async with engine.connect() as conn:
        run = (await conn.execute(text("SELECT lateness_ms, jitter_ms FROM scheduler_runs"))).one()
    assert run.lateness_ms == 0
    assert run.jitter_ms == int(jitter * 1000)


async def test_a_paused_replica_job_runs_on_no_worker(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    await start_scheduler(_sweep(), clock=clock)
    await _next_run_is(engine, T0 + MINUTE)
    await queries.set_paused(engine, "sweep", True)
    await clock.wait_for_sleepers(2)
    clock.advance(60)
    await _next_run_is(engine, T0 + 2 * MINUTE)
    assert await runs(engine, "sweep") == []


async def test_run_now_of_a_replica_job_is_refused_saying_why(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    await start_scheduler(_sweep(), clock=clock)
    await _next_run_is(engine, T0 + MINUTE)
    with pytest.raises(Conflict, match="every worker"):
        await queries.run_job_now(engine, "sweep", clock.now())
