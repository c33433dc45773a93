"""A per-worker job's last status tells what runs now: one worker's outcome or one dead
worker's reap must not overwrite 'running' while another worker's run still holds its
lease (the page shows last_status only)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from app.admin import queries
from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.registry import JobSpec
from app.scheduler.store import HeldLease, Outcome

from ..scheduler.conftest import make_runner

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")


def _sweep() -> JobSpec:
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="sweep", leader_only=False)
    async def sweep(ctx: JobContext) -> None:
        return None

    return scheduler.jobs["sweep"]


async def _listed(database: Database, clock: FakeClock) -> dict[str, object]:
    [job] = await queries.list_jobs(database.engine, clock.now())
    return job


async def test_a_dead_workers_reap_leaves_running_while_another_worker_still_runs_the_job(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _sweep()
    dead, alive, leader = (make_runner(database, clock, pid=pid) for pid in (11, 12, 13))
    await dead.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    lease = dead.lease_seconds
    await dead.store.start_replica_run(spec, T0, clock.now(), lease_seconds=lease)
    alive_run, _ = await alive.store.start_replica_run(spec, T0, clock.now(), lease_seconds=lease)
    clock.advance(lease / 2)
    renewed = await alive.store.renew_leases([HeldLease("sweep", alive_run, replica=True)], lease)
    assert renewed == {alive_run}
    clock.advance(lease / 2 + 1)  # the dead worker's lease ran out; the live one holds
    await leader.store.reap(clock.now())
    job = await _listed(database, clock)
    assert job["running"] is True
    assert job["last_status"] == "running", job


async def test_one_workers_outcome_leaves_running_while_another_worker_still_runs_the_job(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _sweep()
    first, second = (make_runner(database, clock, pid=pid) for pid in (21, 22))
    await first.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    lease = first.lease_seconds
    done, _ = await first.store.start_replica_run(spec, T0, clock.now(), lease_seconds=lease)
    await second.store.start_replica_run(spec, T0, clock.now(), lease_seconds=lease)
    clock.advance(1)
    await first.store.finish_many([Outcome(done, "sweep", "ok", clock.now(), 1000, None)])
    job = await _listed(database, clock)
    assert job["running"] is True
    assert job["last_status"] == "running", job


async def test_a_per_worker_start_that_reaps_a_dead_workers_run_shows_no_stale_error(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _sweep()
    dead, alive = (make_runner(database, clock, pid=pid) for pid in (31, 32))
    await dead.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    lease = dead.lease_seconds
    await dead.store.start_replica_run(spec, T0, clock.now(), lease_seconds=lease)
    clock.advance(lease + 1)  # the dead worker's lease ran out; the next start reaps it
    _, reaped = await alive.store.start_replica_run(
        spec, clock.now(), clock.now(), lease_seconds=lease
    )
    assert len(reaped) == 1
    job = await _listed(database, clock)
    assert (job["last_status"], job["last_error"]) == ("running", None), job


async def test_a_leader_claim_that_reaps_a_dead_run_shows_no_stale_error(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="tick")
    async def tick(ctx: JobContext) -> None:
        return None

    spec = scheduler.jobs["tick"]
    dead, alive = (make_runner(database, clock, pid=pid) for pid in (41, 42))
    rows = await dead.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    first = await dead.claim_leader(spec, rows["tick"].next_run_at, None)
    assert first is not None and first.runs
    clock.advance(dead.lease_seconds + 60)  # its process died; the next claim reaps it
    second = await alive.claim_leader(spec, first.next_slot, None)
    assert second is not None and second.runs
    job = await _listed(database, clock)
    assert (job["last_status"], job["last_error"]) == ("running", None), job
