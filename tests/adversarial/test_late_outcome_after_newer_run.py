"""The job row shows the newest run's outcome: the late outcome of a run whose lease ran
out (its process froze past it) lands on its own run row only, once a newer run of the
job has started, even when that newer run has already finished."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from sqlalchemy import text

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.registry import JobSpec
from app.scheduler.store import JobStore, Outcome

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")
LEASE = 30.0


def _spec(*, leader_only: bool) -> JobSpec:
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="sweep", leader_only=leader_only)
    async def sweep(ctx: JobContext) -> None:
        return None

    return scheduler.jobs["sweep"]


def _store(database: Database, clock: FakeClock, pid: int) -> JobStore:
    return JobStore(database.engine, pid=pid, host="test", lease_clock=clock)


async def _job_row(database: Database) -> dict[str, object]:
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
    claimed = await store.claim(
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
    assert await _job_row(database) == {
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
    assert (await _job_row(database))["last_status"] == "abandoned"
    await frozen.finish_many([Outcome(stale_run, "sweep", "ok", clock.now(), 31000, None)])
    assert (await _job_row(database))["last_status"] == "ok"


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
    assert await _job_row(database) == {
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
    assert (await _job_row(database))["last_status"] == "error"
