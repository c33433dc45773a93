"""Per-worker jobs (leader_only=False) tell the truth: their row shows the soonest
upcoming slot, lateness is measured from the jittered fire time (the jitter recorded
apart), pause stops them on every worker, and run-now is refused with a reason.

A release that flips a job between leader-only and per-worker, its schedule unchanged,
while workers of the other release still run: the job row's leader_only, written by
the newest registration, says who fires it. Two registrations of one job id in one
schedule stand for the two releases."""

import asyncio
import os
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.operations.errors import Conflict
from app.operations.jobs import run_job_now, set_paused
from app.scheduler import FakeClock, JobContext, Role, Scheduler, every
from app.scheduler.election import WAKE_CHANNEL

from .conftest import JobRowTraffic, StartScheduler, eventually, runs, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MINUTE = timedelta(minutes=1)
SLOT = T0 + timedelta(hours=1)


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
    await set_paused(engine, "sweep", True)
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
        await run_job_now(engine, "sweep", lease_now=clock.now())


async def _noop(ctx: JobContext) -> None:
    return None


def _release(*, leader_only: bool) -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="sweep", leader_only=leader_only)(_noop)
    return scheduler


async def _runs_by_scope(engine: AsyncEngine) -> dict[str, int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT scope, count(*) AS runs FROM scheduler_runs"
                " WHERE job_id = 'sweep' AND status <> 'running' GROUP BY scope"
            )
        )
        return {row.scope: row.runs for row in rows}


async def _leader_only(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        flag: bool = (
            await conn.execute(text("SELECT leader_only FROM scheduler_jobs WHERE id = 'sweep'"))
        ).scalar_one()
        return flag


async def _woken_tick(engine: AsyncEngine, traffic: JobRowTraffic) -> None:
    """One more tick of the leader, woken as the admin wakes it (whether or not it
    sleeps on the clock now)."""
    traffic.clear()
    async with engine.connect() as conn:
        await conn.execute(text(f"NOTIFY {WAKE_CHANNEL}"))
        await conn.commit()
    await asyncio.wait_for(traffic.heartbeat.wait(), 10)


async def test_a_leader_stops_firing_a_job_a_newer_release_made_per_worker(
    start_scheduler: StartScheduler, engine: AsyncEngine, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    old = await start_scheduler(_release(leader_only=True), clock=clock)
    await old.wait_until_firing()
    # A worker of the new release starts beside the old leader and registers the job
    # as per-worker.
    await start_scheduler(_release(leader_only=False), clock=clock)

    async def per_worker() -> bool:
        return not await _leader_only(engine)

    await eventually(per_worker, what="the new release's registration")
    # A tick of the old leader reads the changed row.
    await _woken_tick(engine, job_row_traffic)

    clock.set(SLOT)

    async def fired_per_worker() -> bool:
        return (await _runs_by_scope(engine)).get("replica", 0) >= 1

    await eventually(fired_per_worker, what="the per-worker run of the slot")
    # The leader's timer woke at the same slot; a tick after it is done with the wake.
    await _woken_tick(engine, job_row_traffic)
    assert await _runs_by_scope(engine) == {"replica": 1}


async def test_a_worker_stops_firing_per_worker_a_job_a_newer_leader_registered_leader_only(
    start_scheduler: StartScheduler, engine: AsyncEngine, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    # A worker of the old release leads (it has no leader job) and fires the job on
    # its own; a worker of the new release, where the job is leader-only, stands by.
    old = await start_scheduler(_release(leader_only=False), clock=clock)
    await old.wait_until_firing()

    async def registered() -> bool:
        async with engine.connect() as conn:
            found = await conn.execute(text("SELECT 1 FROM scheduler_jobs WHERE id = 'sweep'"))
            return found.first() is not None

    await eventually(registered, what="the old release's registration")
    new = await start_scheduler(_release(leader_only=True), clock=clock)
    await new.wait_for_role(Role.STANDBY)
    # The old worker loses the key (its lock connection dies) and keeps running.
    assert old.lock is not None
    async with engine.begin() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": old.lock.backend_pid})
    await new.wait_until_firing()
    assert await _leader_only(engine)

    clock.set(SLOT)

    async def fired_by_the_leader() -> bool:
        return (await _runs_by_scope(engine)).get("leader", 0) >= 1

    await eventually(fired_by_the_leader, what="the leader's run of the slot")
    await _woken_tick(engine, job_row_traffic)
    assert await _runs_by_scope(engine) == {"leader": 1}
