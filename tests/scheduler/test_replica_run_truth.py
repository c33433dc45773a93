"""A per-worker run (leader_only=False) is shown running only while a live worker runs
it: its run row holds a running lease of its own, renewed by its worker, and a run
whose worker died is reaped to ``abandoned`` once that lease passes. Its job's last
status tells what runs now: one worker's outcome or one dead worker's reap does not
overwrite 'running' while another worker's run still holds its lease (the page shows
last_status only)."""

from __future__ import annotations

import asyncio
import functools
import os
import signal
import socket
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.operations.jobs import list_jobs
from app.operations.runs import job_runs
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.registry import JobSpec
from app.scheduler.store import HeldLease, JobStore, Outcome
from app.testing.claims import claim_leader

from ..procs.cluster import LEASE_SECONDS, Cluster
from ..procs.gated_app import GATE_KEY
from .conftest import BlockingBodies, make_runner

WORKERS = 2
T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")


@pytest.fixture
def replica_cluster(
    database_url: str, tmp_path: Path, gate: psycopg.Connection[tuple[object, ...]]
) -> Iterator[Cluster]:
    """Two workers, each with its run of the per-worker job blocked at the gate."""
    cluster = Cluster(database_url, tmp_path, app="tests.procs.replica_app:app")
    cluster.start(WORKERS)
    try:
        cluster.wait_for(
            lambda: _running_pids(cluster) == set(cluster.processes), 30, "a run on every worker"
        )
        yield cluster
    finally:
        gate.execute("SELECT pg_advisory_unlock_all()")
        cluster.stop()


def _running_pids(cluster: Cluster) -> set[int]:
    rows = cluster.query(
        "SELECT DISTINCT pid FROM scheduler_runs WHERE job_id = 'sweep' AND status = 'running'"
    )
    return {int(pid) for (pid,) in rows}


def _runs_of(cluster: Cluster, pid: int) -> list[tuple[object, ...]]:
    return cluster.query(
        "SELECT status, error FROM scheduler_runs WHERE job_id = 'sweep' AND pid = %s ORDER BY id",
        pid,
    )


@pytest.mark.multiprocess
def test_a_per_worker_run_whose_process_died_is_not_shown_running_for_good(
    replica_cluster: Cluster,
) -> None:
    cluster = replica_cluster
    victim = next(pid for pid in cluster.processes if pid != cluster.leader())
    os.kill(victim, signal.SIGKILL)
    cluster.processes[victim].wait(10)
    cluster.wait_for(
        lambda: [status for status, _ in _runs_of(cluster, victim)] == ["abandoned"],
        LEASE_SECONDS + 10,
        "the dead worker's run reaped",
    )
    [(_, note)] = _runs_of(cluster, victim)
    assert f"pid {victim} on {socket.gethostname()}" in str(note)
    # The other worker's run still holds its lease: the job still runs (its history
    # keeps the dead worker's abandoned run).
    [(last_status,)] = cluster.query("SELECT last_status FROM scheduler_jobs WHERE id = 'sweep'")
    assert last_status == "running"


@pytest.mark.multiprocess
def test_a_per_worker_run_that_outlives_its_lease_in_a_live_worker_stays_running(
    replica_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    cluster = replica_cluster
    _wait_for_a_reap_twice_the_lease_after(cluster, time.time())
    assert _running_pids(cluster) == set(cluster.processes)
    gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    for pid in cluster.processes:
        cluster.wait_for(
            functools.partial(_first_run_ended_ok, cluster, pid),
            10,
            f"the real outcome of worker {pid}'s run",
        )


@pytest.mark.multiprocess
def test_a_per_worker_thread_run_keeps_its_lease_when_its_workers_event_loop_ends_first(
    replica_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Ctrl-C twice: the event loop ends while the body's thread runs; the keeper thread
    renews the run's own lease, so the run is not reaped, and its thread records it."""
    cluster = replica_cluster
    owner = next(pid for pid in cluster.processes if pid != cluster.leader())
    os.kill(owner, signal.SIGINT)
    cluster.wait_for(
        lambda: "scheduler.waiting_for_threads" in cluster.log_of(owner), 10, "the wait"
    )
    os.kill(owner, signal.SIGINT)
    cluster.wait_for(
        lambda: "Application shutdown complete" in cluster.log_of(owner), 10, "the lifespan's end"
    )
    _wait_for_a_reap_twice_the_lease_after(cluster, time.time())
    assert [status for status, _ in _runs_of(cluster, owner)] == ["running"]
    gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    cluster.wait_for(
        functools.partial(_first_run_ended_ok, cluster, owner), 10, "the owner's real outcome"
    )


def _wait_for_a_reap_twice_the_lease_after(cluster: Cluster, since: float) -> None:
    # The leader reaps before it beats in each tick: a beat twice the lease after
    # ``since`` follows a reap that would have taken any lease nobody renewed since.
    cluster.wait_for(
        lambda: cluster.query(
            "SELECT 1 FROM scheduler_leadership WHERE heartbeat_at > to_timestamp(%s)",
            since + 2 * LEASE_SECONDS + 1,
        ),
        2 * LEASE_SECONDS + 20,
        "a leader tick twice the lease later",
    )


def _first_run_ended_ok(cluster: Cluster, pid: int) -> bool:
    return _runs_of(cluster, pid)[:1] == [("ok", None)]


def _noop_sweep() -> JobSpec:
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="sweep", leader_only=False)
    async def sweep(ctx: JobContext) -> None:
        return None

    return scheduler.jobs["sweep"]


async def _history(engine: AsyncEngine) -> list[tuple[object, ...]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT status, pid, running_until FROM scheduler_runs ORDER BY id")
        )
        return [tuple(row) for row in result]


async def _job_outcome(engine: AsyncEngine) -> tuple[object, ...]:
    async with engine.connect() as conn:
        query = text("SELECT last_status, last_error FROM scheduler_jobs WHERE id = 'sweep'")
        return tuple((await conn.execute(query)).one())


async def test_a_per_worker_run_whose_worker_died_is_reaped_by_the_jobs_next_run_with_no_leader(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    spec = _noop_sweep()
    dead = make_runner(database, clock, pid=999_999)
    await dead.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    # A worker that started its run with a 30 s lease, then died.
    await dead.store.start_replica_run(spec, T0, T0, lease_seconds=dead.lease_seconds)
    clock.advance(60)
    await make_runner(database, clock, pid=2).fire_replica(spec, T0 + timedelta(minutes=1))
    assert await _history(engine) == [("abandoned", 999_999, None), ("ok", 2, None)]
    [_, dead_run] = await job_runs(engine, "sweep")  # newest first
    assert "pid 999999 on test" in dead_run["error"]


async def test_a_per_worker_run_reaped_while_its_body_still_ran_records_its_real_outcome(
    database: Database, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="sweep", leader_only=False)(bodies)
    spec = scheduler.jobs["sweep"]
    runner = make_runner(database, clock)
    await runner.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    fire = asyncio.create_task(runner.fire_replica(spec, T0))
    await bodies.entered()
    # A reaper that sees the lease run out (the worker froze past it, say), while the
    # worker's own clock has not moved to renew it.
    lapsed = FakeClock(T0 + timedelta(seconds=runner.lease_seconds + 1))
    reaper = JobStore(database.engine, pid=2, host="test", lease_clock=lapsed)
    assert await reaper.reap(lapsed.now()) == ["sweep"]
    assert [status for status, _, _ in await _history(engine)] == ["abandoned"]
    bodies.release.set()
    await fire
    assert await _history(engine) == [("ok", 1, None)]
    assert await _job_outcome(engine) == ("ok", None)


async def test_a_reaped_per_worker_run_leaves_an_outcome_recorded_after_its_lease_ran_out(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    spec = _noop_sweep()
    dead = make_runner(database, clock, pid=999_999)
    await dead.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    await dead.store.start_replica_run(spec, T0, T0, lease_seconds=dead.lease_seconds)
    # Another worker's run ends after the dead worker's lease ran out, before any reap.
    live = make_runner(database, clock, pid=2)
    run_id, _ = await live.store.start_replica_run(spec, T0, T0, lease_seconds=live.lease_seconds)
    clock.advance(dead.lease_seconds + 1)
    await live.store.finish_many([Outcome(run_id, "sweep", "ok", clock.now(), 0, None)])
    assert await live.store.reap(clock.now()) == ["sweep"]
    assert [status for status, _, _ in await _history(engine)] == ["abandoned", "ok"]
    assert await _job_outcome(engine) == ("ok", None)


async def test_a_per_worker_job_whose_body_runs_is_listed_running(
    database: Database, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="sweep", leader_only=False)(bodies)
    spec = scheduler.jobs["sweep"]
    runner = make_runner(database, clock)
    await runner.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    fire = asyncio.create_task(runner.fire_replica(spec, T0))
    await bodies.entered()
    [job] = await list_jobs(engine, clock.now())
    bodies.release.set()
    await fire
    assert (job["running"], job["last_status"]) == (True, "running")


async def test_an_ok_from_a_worker_whose_clock_runs_behind_is_not_overwritten_by_a_reap(
    database: Database, engine: AsyncEngine
) -> None:
    """The dead worker's lease ran out (on the lease clock) before the live worker's run
    ended; the live worker's own clock, which stamps its finish, is 5 minutes behind."""
    clock = FakeClock(T0)
    spec = _noop_sweep()
    dead = make_runner(database, clock, pid=999_999)
    await dead.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    await dead.store.start_replica_run(spec, T0, T0, lease_seconds=dead.lease_seconds)
    live = make_runner(database, clock, pid=2)
    run_id, _ = await live.store.start_replica_run(spec, T0, T0, lease_seconds=live.lease_seconds)
    clock.advance(dead.lease_seconds + 1)
    behind = clock.now() - timedelta(minutes=5)
    await live.store.finish_many([Outcome(run_id, "sweep", "ok", behind, 0, None)])
    assert await live.store.reap(clock.now()) == ["sweep"]
    assert await _job_outcome(engine) == ("ok", None)


async def _listed(database: Database, clock: FakeClock) -> dict[str, object]:
    [job] = await list_jobs(database.engine, clock.now())
    return job


async def test_a_dead_workers_reap_leaves_running_while_another_worker_still_runs_the_job(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = _noop_sweep()
    dead, alive, leader = (make_runner(database, clock, pid=pid) for pid in (11, 12, 13))
    await dead.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    lease = dead.lease_seconds
    await dead.store.start_replica_run(spec, T0, clock.now(), lease_seconds=lease)
    alive_run, _ = await alive.store.start_replica_run(spec, T0, clock.now(), lease_seconds=lease)
    clock.advance(lease / 2)
    renewed = await alive.store.renew_leases([HeldLease("sweep", alive_run, "run")], lease)
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
    spec = _noop_sweep()
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
    spec = _noop_sweep()
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
    first = await claim_leader(dead, spec, rows["tick"].next_run_at, None)
    assert first is not None and first.runs
    clock.advance(dead.lease_seconds + 60)  # its process died; the next claim reaps it
    second = await claim_leader(alive, spec, first.next_slot, None)
    assert second is not None and second.runs
    job = await _listed(database, clock)
    assert (job["last_status"], job["last_error"]) == ("running", None), job
