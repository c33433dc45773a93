"""Three real app processes on one database, and the faults a production system meets.

Each test asserts invariants (one holder, no slot fired twice, a live process fires
again), never the order of log lines. The election's tests run in two layouts: each
process a host of its own (its own runtime directory), and the three as workers of one
host sharing its host lock (``uvicorn --workers 3`` on one machine, the default).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.scheduler.keys import LEADER_KEY_LOCKS
from app.testing import TestServer

from ..procs.cluster import LEADER_TICK_SECONDS, LEASE_SECONDS, PROBE_TABLE_SQL, Cluster
from ..procs.gated_app import GATE_KEY

pytestmark = pytest.mark.multiprocess


@pytest.fixture(params=["host-per-worker", "one-host"])
def layout(request: pytest.FixtureRequest) -> str:
    """Where the processes keep their host lock: each its own runtime directory, or
    one shared by all three."""
    return str(request.param)


@pytest.fixture
def cluster(database_url: str, tmp_path: Path, layout: str) -> Iterator[Cluster]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(PROBE_TABLE_SQL)
    cluster = Cluster(database_url, tmp_path)
    cluster.start(runtime_dir=tmp_path / "host" if layout == "one-host" else None)
    try:
        # Start-up is not what these tests bound (three interpreters importing the app
        # at once take 20 s on a loaded 2-core machine): wait long for it.
        cluster.leader(timeout=60)
        # Wait until the schedule runs: the probe has fired at least once.
        cluster.wait_for(lambda: cluster.query("SELECT 1 FROM probe_fires LIMIT 1"), 60, "a fire")
        yield cluster
    finally:
        cluster.stop()
    assert cluster.slots_fired_twice() == []


def test_kill_9_of_the_leader_another_process_fires_within_3_s(cluster: Cluster) -> None:
    leader = cluster.leader()
    fault = time.time()
    os.kill(leader, signal.SIGKILL)
    cluster.wait_for(
        lambda: cluster.fires_by_other_than(leader, fault) > 0, 3, "a fire by another process"
    )
    assert len(cluster.holders()) == 1


def test_terminated_lock_connection_demotes_the_leader_and_no_slot_fires_twice(
    cluster: Cluster,
) -> None:
    leader = cluster.leader()
    # The leader lives on and contends again: a standby must already queue for the key,
    # or (with one host lock, released as the leader is promoted and polled by the
    # others) the demoted leader may take the host's turn again before any other.
    cluster.wait_for(
        lambda: (
            cluster.query(
                f"SELECT count(*) FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND NOT granted"
            )[0][0]
            >= 1
        ),
        20,
        "a standby to queue for the key",
    )
    fault = time.time()
    cluster.query("SELECT pg_terminate_backend(%s)", cluster.lock_backend_pid())
    cluster.wait_for(lambda: "scheduler.demoted" in cluster.log_of(leader), 5, "the demotion")
    cluster.wait_for(lambda: cluster.fires_by_other_than(leader, fault) > 0, 5, "a new fire")
    assert len(cluster.holders()) == 1
    assert cluster.slots_fired_twice() == []


def test_sigterm_of_the_leader_hands_over_within_2_s(cluster: Cluster) -> None:
    leader = cluster.leader()
    os.kill(leader, signal.SIGTERM)
    cluster.wait_for(
        lambda: cluster.holders() not in ([], [leader]), 2, "a new holder after SIGTERM"
    )
    cluster.processes[leader].wait(30)
    assert f"scheduler.demoted (pid={leader}, reason=stopped)" in cluster.log_of(leader)


def test_workers_stopped_together_promote_no_standby(cluster: Cluster, layout: str) -> None:
    """SIGTERM to every worker (Ctrl-C, a deploy): the standbys are told first, the old
    leader then releases the key while their servers still drain, and no standby that
    was told to stop promotes (it used to log promoted, then demoted 30 ms later)."""
    leader = cluster.leader()
    standbys = [pid for pid in cluster.processes if pid != leader]
    # Workers of one host queue one standby in PostgreSQL; the other waits on the flock.
    queued = 1 if layout == "one-host" else len(standbys)
    cluster.wait_for(
        lambda: (
            cluster.query(
                f"SELECT count(*) FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND NOT granted"
            )[0][0]
            == queued
        ),
        20,
        "the standbys to queue for the key",
    )
    for pid in [*standbys, leader]:
        cluster.processes[pid].send_signal(signal.SIGTERM)
    for process in cluster.processes.values():
        process.wait(30)
    assert [pid for pid in standbys if "scheduler.promoted" in cluster.log_of(pid)] == []


def test_a_sigstopped_leader_is_replaced_within_the_lease_and_fires_nothing_after_sigcont(
    cluster: Cluster,
) -> None:
    """A hung leader (SIGSTOP, a paused VM, a blocked event loop) is replaced once the
    server's idle timeout ends its lock connection: a fire by another process within the
    lease plus a tick (and the next 1 s slot) of the stop, on its own host too. Resumed,
    it steps down and fires nothing more."""
    leader = cluster.leader()
    os.kill(leader, signal.SIGSTOP)
    stopped_at = time.time()
    cluster.wait_for(
        lambda: cluster.fires_by_other_than(leader, stopped_at) > 0,
        LEASE_SECONDS + LEADER_TICK_SECONDS + 1,
        "a fire by another process within the lease and a tick",
    )
    os.kill(leader, signal.SIGCONT)
    resumed = time.time()
    cluster.wait_for(lambda: "scheduler.demoted" in cluster.log_of(leader), 10, "the demotion")
    # Three more slots go by; none of them may be the old leader's.
    cluster.wait_for(
        lambda: cluster.fires_by_other_than(leader, resumed) >= 3, 10, "fires after SIGCONT"
    )
    late = cluster.query(
        "SELECT count(*) FROM probe_fires WHERE pid = %s AND fired_at > to_timestamp(%s)",
        leader,
        stopped_at,
    )
    assert late == [(0,)]
    assert len(cluster.holders()) == 1


@pytest.mark.restarts_server
def test_postgres_restart_gives_exactly_one_leader_within_the_lease(
    cluster: Cluster, server: TestServer
) -> None:
    server.restart()
    returned = time.time()
    cluster.wait_for(lambda: len(cluster.holders()) == 1, LEASE_SECONDS, "one leader")
    cluster.wait_for(
        lambda: (
            cluster.query(
                "SELECT count(*) FROM probe_fires WHERE fired_at > to_timestamp(%s)", returned
            )[0][0]
            >= 3
        ),
        10,
        "fires after the restart",
    )
    assert len(cluster.holders()) == 1
    assert cluster.slots_fired_twice() == []


@pytest.fixture
def gated_cluster(
    database_url: str, tmp_path: Path, gate: psycopg.Connection[tuple[object, ...]]
) -> Iterator[Cluster]:
    """Three processes with the gated thread job; its first body is blocked at the gate."""
    cluster = Cluster(database_url, tmp_path, app="tests.procs.gated_app:app")
    cluster.start()
    try:
        cluster.wait_for(lambda: cluster.query("SELECT 1 FROM gated_bodies"), 60, "a body")
        yield cluster
    finally:
        gate.execute("SELECT pg_advisory_unlock_all()")
        cluster.stop()


def _bodies_at_once(cluster: Cluster) -> int:
    """The most gated bodies that ran at the same time (a killed body never ends)."""
    rows = cluster.query(
        "SELECT count(*) FROM gated_bodies a JOIN gated_bodies b ON a.slot < b.slot"
        " AND b.started_at < coalesce(a.ended_at, 'infinity')"
    )
    return 1 + int(rows[0][0] > 0)


def _runs_by_others(cluster: Cluster, status: str, owner: int) -> int:
    rows = cluster.query(
        "SELECT count(*) FROM scheduler_runs WHERE job_id = 'gated' AND status = %s AND pid <> %s",
        status,
        owner,
    )
    return int(rows[0][0])


def test_a_new_leader_skips_slots_while_the_old_leaders_thread_still_runs(
    gated_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    cluster = gated_cluster
    owner = int(cluster.query("SELECT pid FROM gated_bodies")[0][0])
    assert cluster.leader() == owner
    cluster.query("SELECT pg_terminate_backend(%s)", cluster.lock_backend_pid())
    cluster.wait_for(
        lambda: _runs_by_others(cluster, "skipped_overlap", owner) >= 2,
        10,
        "slots skipped by the new leader",
    )
    assert cluster.query("SELECT count(*) FROM gated_bodies") == [(1,)]
    gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    cluster.wait_for(
        lambda: (
            cluster.query(
                "SELECT status FROM scheduler_runs WHERE job_id = 'gated' AND pid = %s"
                " ORDER BY id LIMIT 1",
                owner,
            )
            == [("ok",)]
        ),
        10,
        "the outcome of the first body",
    )
    cluster.wait_for(
        lambda: _runs_by_others(cluster, "ok", owner) >= 1, 10, "a run by the new leader"
    )
    assert _bodies_at_once(cluster) == 1


def test_a_killed_owners_running_lease_runs_out_and_another_process_runs_the_job(
    gated_cluster: Cluster,
) -> None:
    cluster = gated_cluster
    owner = int(cluster.query("SELECT pid FROM gated_bodies")[0][0])
    os.kill(owner, signal.SIGKILL)
    cluster.wait_for(
        lambda: cluster.query("SELECT 1 FROM gated_bodies WHERE pid <> %s", owner),
        LEASE_SECONDS + 5,
        "a body on another process once the lease ran out",
    )
    others = cluster.query(
        "SELECT status FROM scheduler_runs WHERE job_id = 'gated' AND pid <> %s ORDER BY id",
        owner,
    )
    # Skipped while the lease lasted, then run: never run beside a body that may live.
    assert others[0] == ("skipped_overlap",)
    assert ("running",) in others


def _wait_past_a_lease_nobody_renews(cluster: Cluster, owner: int, since: float) -> None:
    """Return once another process claimed a slot of the gated job twice the lease after
    ``since``: a lease that nobody renewed since then has run out by that claim."""
    cluster.wait_for(
        lambda: cluster.query(
            "SELECT 1 FROM scheduler_runs WHERE job_id = 'gated' AND pid <> %s"
            " AND started_at > to_timestamp(%s)",
            owner,
            since + 2 * LEASE_SECONDS + 1,
        ),
        2 * LEASE_SECONDS + 20,
        "a claim by another process twice the lease later",
    )


def _first_body_ends_alone(
    cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]], owner: int
) -> None:
    """Only the owner's body ran so far; once the gate opens it is recorded ok, its
    process exits, and the job runs elsewhere, never two bodies at once."""
    runs = cluster.query("SELECT pid, status FROM scheduler_runs WHERE job_id = 'gated'")
    assert cluster.query("SELECT pid, ended_at FROM gated_bodies") == [(owner, None)], runs
    gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    cluster.wait_for(
        lambda: (
            cluster.query(
                "SELECT status FROM scheduler_runs WHERE job_id = 'gated' AND pid = %s"
                " ORDER BY id LIMIT 1",
                owner,
            )
            == [("ok",)]
        ),
        10,
        "the real outcome of the first body",
    )
    cluster.processes[owner].wait(10)
    cluster.wait_for(
        lambda: _runs_by_others(cluster, "ok", owner) >= 1, 10, "a run by another process"
    )
    assert _bodies_at_once(cluster) == 1


def test_a_thread_job_never_overlaps_itself_across_a_graceful_shutdown_of_its_owner(
    gated_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A rolling deploy: SIGTERM to the process whose thread body runs, longer than the
    shutdown grace and the lease. The shutdown waits for the thread, renewing its lease,
    so no other body starts until the first ended, and the first run gets its real
    outcome."""
    cluster = gated_cluster
    owner = int(cluster.query("SELECT pid FROM gated_bodies")[0][0])
    terminated = time.time()
    os.kill(owner, signal.SIGTERM)
    _wait_past_a_lease_nobody_renews(cluster, owner, terminated)
    _first_body_ends_alone(cluster, gate, owner)


def test_a_thread_job_keeps_its_lease_when_its_owners_event_loop_ends_before_the_body(
    gated_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Ctrl-C twice: the second stops the shutdown's wait for the thread, and the event
    loop ends (asyncio.run cancels every task) while the body runs. Python still waits
    for the thread before the process exits, so the lease must hold from the thread's
    side, and the body's thread records its outcome."""
    cluster = gated_cluster
    owner = int(cluster.query("SELECT pid FROM gated_bodies")[0][0])
    os.kill(owner, signal.SIGINT)
    cluster.wait_for(
        lambda: "scheduler.waiting_for_threads" in cluster.log_of(owner), 10, "the wait"
    )
    os.kill(owner, signal.SIGINT)
    cluster.wait_for(
        lambda: "Application shutdown complete" in cluster.log_of(owner), 10, "the lifespan's end"
    )
    _wait_past_a_lease_nobody_renews(cluster, owner, time.time())
    _first_body_ends_alone(cluster, gate, owner)
