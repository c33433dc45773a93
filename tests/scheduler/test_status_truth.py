"""A job's last_status says what runs now: the running lease is the truth for
"running", a skipped or missed slot never hides a body that still runs, and a run
whose owner died is reaped to ``abandoned`` once its lease has passed. The job row
shows the newest run's outcome: the late outcome of a run whose lease ran out (its
process froze past it) lands on its own run row only, once a newer run of the job has
started, even when that newer run has already finished."""

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.registry import JobSpec
from app.scheduler.runner import Runner
from app.scheduler.store import JobStore, Outcome
from app.testing.claims import claim_leader, claim_slot

from .conftest import (
    BlockingBodies,
    StartScheduler,
    eventually,
    runs,
    wait_for_runs,
    wait_for_runs_past_busy_rows,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")
LEASE = 30.0


async def _job_row(engine: AsyncEngine, job_id: str) -> dict[str, object]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT last_status, running_run_id FROM scheduler_jobs WHERE id = :id"),
                {"id": job_id},
            )
        ).one()
        return dict(row._mapping)


async def test_a_skipped_overlap_leaves_the_job_running_while_its_body_runs(
    start_scheduler: StartScheduler, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(seconds=10), id="long_thread")(bodies)
    supervisor = await start_scheduler(scheduler, clock=clock, lease_seconds=30)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await bodies.entered()
    await clock.wait_for_sleepers(3)
    clock.advance(10)  # the body's lease renewal wakes with the slot: its row may be busy
    history = await wait_for_runs_past_busy_rows(engine, clock, "long_thread", 2, sleepers=3)
    assert [status for status, _ in history] == ["running", "skipped_overlap"]
    assert (await _job_row(engine, "long_thread"))["last_status"] == "running"
    bodies.release.set()
    await wait_for_runs(engine, "long_thread", 2)


async def test_a_run_whose_owner_died_is_reaped_to_abandoned_once_its_lease_passes(
    start_scheduler: StartScheduler, database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()

    @scheduler.job(every(hours=1), id="orphaned")
    async def orphaned(ctx: JobContext) -> None:
        return None

    spec = scheduler.jobs["orphaned"]
    # A process that claimed a slot with a 15 s running lease, then died.
    dead = Runner(
        JobStore(database.engine, pid=999_999, host="gone", lease_clock=clock),
        clock=clock,
        zone=ZoneInfo("UTC"),
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=15,
    )
    rows = await dead.store.register_leader_jobs([spec], clock.now(), ZoneInfo("UTC"))
    clock.set(rows["orphaned"].next_run_at)
    assert await claim_leader(dead, spec, rows["orphaned"].next_run_at, None) is not None
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    assert (await _job_row(engine, "orphaned"))["last_status"] == "running"
    await clock.wait_for_sleepers(2)
    clock.advance(16)

    async def reaped() -> bool:
        return [status for status, _ in await runs(engine, "orphaned")] == ["abandoned"]

    await eventually(reaped, what="the dead owner's run reaped")
    assert await _job_row(engine, "orphaned") == {
        "last_status": "abandoned",
        "running_run_id": None,
    }


async def test_a_leader_runs_lateness_counts_from_its_jittered_fire_time(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="jittered", jitter=30)
    async def jittered(ctx: JobContext) -> None:
        return None

    slot = T0 + timedelta(minutes=1)
    jitter = scheduler.jobs["jittered"].jitter_delay(slot)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.set(slot + timedelta(seconds=jitter))
    await wait_for_runs(engine, "jittered", 1)
    async with engine.connect() as conn:
        run = (await conn.execute(text("SELECT lateness_ms, jitter_ms FROM scheduler_runs"))).one()
    assert (run.lateness_ms, run.jitter_ms) == (0, int(jitter * 1000))


async def test_an_outcome_whose_write_lost_its_connection_is_still_recorded(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    release = asyncio.Event()

    @scheduler.job(every(hours=1), id="brief", first_run=0)
    async def brief(ctx: JobContext) -> None:
        await release.wait()

    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await wait_for_runs(engine, "brief", 1, finished=False)
    async with engine.connect() as blocker:
        # The job row locked: the outcome write waits on it, mid-transaction.
        await blocker.execute(text("SELECT 1 FROM scheduler_jobs WHERE id = 'brief' FOR UPDATE"))
        release.set()

        async def writer() -> int | None:
            async with engine.connect() as conn:
                pid: int | None = (await conn.execute(_OUTCOME_WRITER)).scalar_one_or_none()
                return pid

        await eventually(lambda: _is_not_none(writer()), what="the outcome write waiting")
        # Its connection is lost there (a server restart, a terminated backend).
        async with engine.begin() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": await writer()})
        await blocker.rollback()

    async def recorded() -> bool:
        return [status for status, _ in await runs(engine, "brief")] == ["ok"]

    await eventually(recorded, what="the run's outcome recorded")


# The backend of the outcome write, while it waits on the job row's lock.
_OUTCOME_WRITER = text(
    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    " AND query LIKE '%UPDATE scheduler_jobs%last_finished_at%'"
)


async def _is_not_none(value: Awaitable[object]) -> bool:
    return await value is not None


def _spec(*, leader_only: bool) -> JobSpec:
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="sweep", leader_only=leader_only)
    async def sweep(ctx: JobContext) -> None:
        return None

    return scheduler.jobs["sweep"]


def _store(database: Database, clock: FakeClock, pid: int) -> JobStore:
    return JobStore(database.engine, pid=pid, host="test", lease_clock=clock)


async def _last_outcome(database: Database) -> dict[str, object]:
    async with database.engine.connect() as conn:
        row = (
            await conn.execute(
                text(
                    "SELECT last_status, last_error, last_finished_at FROM scheduler_jobs"
                    " WHERE id = 'sweep'"
                )
            )
        ).one()
    return dict(row._mapping)


async def _run_status(database: Database, run_id: int) -> str:
    async with database.engine.connect() as conn:
        status: str = (
            await conn.execute(
                text("SELECT status FROM scheduler_runs WHERE id = :id"), {"id": run_id}
            )
        ).scalar_one()
    return status


async def _claim_running(store: JobStore, spec: JobSpec, due: datetime) -> int:
    claimed = await claim_slot(
        store,
        spec,
        due=due,
        next_slot=spec.trigger.next_after(due, UTC_ZONE),
        run_slot=due,
        now=due,
        status="running",
        fence_pid=None,
        lease_seconds=LEASE,
    )
    assert claimed is not None and claimed.status == "running", claimed
    return claimed.run_id


async def test_a_frozen_leaders_late_outcome_does_not_overwrite_a_newer_finished_run(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _spec(leader_only=True)
    frozen, successor = _store(database, clock, 31), _store(database, clock, 32)
    rows = await frozen.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    first_slot = rows["sweep"].next_run_at
    clock.set(first_slot)
    stale_run = await _claim_running(frozen, spec, first_slot)
    # The first leader freezes past its lease; the next leader claims the next slot,
    # which reaps the stale run, and its own run finishes.
    second_slot = spec.trigger.next_after(first_slot, UTC_ZONE)
    clock.set(second_slot)
    newer_run = await _claim_running(successor, spec, second_slot)
    clock.advance(1)
    await successor.finish_many([Outcome(newer_run, "sweep", "ok", clock.now(), 1000, None)])
    newer_finished = clock.now()
    clock.advance(1)
    await frozen.finish_many([Outcome(stale_run, "sweep", "error", clock.now(), 62000, "boom")])
    assert await _run_status(database, stale_run) == "error"
    assert await _last_outcome(database) == {
        "last_status": "ok",
        "last_error": None,
        "last_finished_at": newer_finished,
    }


async def test_a_reaped_leader_runs_late_outcome_still_replaces_the_abandoned_guess(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _spec(leader_only=True)
    frozen, leader = _store(database, clock, 41), _store(database, clock, 42)
    rows = await frozen.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    slot = rows["sweep"].next_run_at
    clock.set(slot)
    stale_run = await _claim_running(frozen, spec, slot)
    clock.advance(LEASE + 1)
    await leader.reap(clock.now())
    assert (await _last_outcome(database))["last_status"] == "abandoned"
    await frozen.finish_many([Outcome(stale_run, "sweep", "ok", clock.now(), 31000, None)])
    assert (await _last_outcome(database))["last_status"] == "ok"


async def test_a_frozen_workers_late_outcome_does_not_overwrite_a_newer_finished_run(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _spec(leader_only=False)
    frozen, alive = _store(database, clock, 51), _store(database, clock, 52)
    await frozen.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    stale_run, _ = await frozen.start_replica_run(spec, T0, clock.now(), lease_seconds=LEASE)
    clock.advance(LEASE + 1)
    # The other worker's next run reaps the frozen worker's run, and finishes.
    newer_run, reaped = await alive.start_replica_run(
        spec, clock.now(), clock.now(), lease_seconds=LEASE
    )
    assert [run.run_id for run in reaped] == [stale_run]
    clock.advance(1)
    await alive.finish_many([Outcome(newer_run, "sweep", "ok", clock.now(), 1000, None)])
    newer_finished = clock.now()
    clock.advance(1)
    await frozen.finish_many([Outcome(stale_run, "sweep", "error", clock.now(), 33000, "boom")])
    assert await _run_status(database, stale_run) == "error"
    assert await _last_outcome(database) == {
        "last_status": "ok",
        "last_error": None,
        "last_finished_at": newer_finished,
    }


async def test_the_last_of_two_overlapping_workers_runs_to_finish_settles_the_job(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _spec(leader_only=False)
    first, second = _store(database, clock, 61), _store(database, clock, 62)
    await first.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    older, _ = await first.start_replica_run(spec, T0, clock.now(), lease_seconds=LEASE)
    newer, _ = await second.start_replica_run(spec, T0, clock.now(), lease_seconds=LEASE)
    clock.advance(1)
    await second.finish_many([Outcome(newer, "sweep", "ok", clock.now(), 1000, None)])
    clock.advance(1)
    await first.finish_many([Outcome(older, "sweep", "error", clock.now(), 2000, "boom")])
    assert (await _last_outcome(database))["last_status"] == "error"
