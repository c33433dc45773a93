"""A per-worker run (leader_only=False) is shown running only while a live worker runs
it: its run row holds a running lease of its own, renewed by its worker, and a run
whose worker died is reaped to ``abandoned`` once that lease passes."""

from __future__ import annotations

import functools
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ..procs.cluster import LEASE_SECONDS, Cluster
from ..procs.gated_app import GATE_KEY
from ..procs.replica_app import REPLICA_BODIES_SQL

WORKERS = 2


@pytest.fixture
def gate(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Held by the test: every gated body blocks in its thread until the gate opens."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(REPLICA_BODIES_SQL)
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        yield conn


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
    [(last_status, last_error)] = cluster.query(
        "SELECT last_status, last_error FROM scheduler_jobs WHERE id = 'sweep'"
    )
    assert (last_status, last_error) == ("abandoned", note)


@pytest.mark.multiprocess
def test_a_per_worker_run_that_outlives_its_lease_in_a_live_worker_stays_running(
    replica_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    cluster = replica_cluster
    started = time.time()
    # The leader reaps before it beats in each tick: a beat twice the lease after the
    # runs started follows a reap that would have taken any lease nobody renewed.
    cluster.wait_for(
        lambda: cluster.query(
            "SELECT 1 FROM scheduler_leadership WHERE heartbeat_at > to_timestamp(%s)",
            started + 2 * LEASE_SECONDS + 1,
        ),
        2 * LEASE_SECONDS + 20,
        "a leader tick twice the lease after the runs started",
    )
    assert _running_pids(cluster) == set(cluster.processes)
    gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    for pid in cluster.processes:
        cluster.wait_for(
            functools.partial(_first_run_ended_ok, cluster, pid),
            10,
            f"the real outcome of worker {pid}'s run",
        )


def _first_run_ended_ok(cluster: Cluster, pid: int) -> bool:
    return _runs_of(cluster, pid)[:1] == [("ok", None)]
