"""A thread job whose owner shuts down gracefully must not run beside its next body.

A rolling deploy sends SIGTERM to the leader while a sync body runs longer than
SHUTDOWN_GRACE_SECONDS. The worker stops the scheduler, then its event loop ends while
the thread is still running (asyncio.run waits for the default executor), so nothing
renews the running lease any more; once it runs out another process starts the job
beside the body that still runs.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ..procs.cluster import LEASE_SECONDS, Cluster
from ..procs.gated_app import GATE_KEY, GATED_TABLE_SQL

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def gate(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Held by the test: every gated body blocks in its thread until the gate opens."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(GATED_TABLE_SQL)
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        yield conn


@pytest.fixture
def gated_cluster(
    database_url: str, tmp_path: Path, gate: psycopg.Connection[tuple[object, ...]]
) -> Iterator[Cluster]:
    """Three processes with the gated thread job; its first body is blocked at the gate."""
    cluster = Cluster(database_url, tmp_path, app="tests.procs.gated_app:app")
    cluster.start()
    try:
        cluster.wait_for(lambda: cluster.query("SELECT 1 FROM gated_bodies"), 20, "a body")
        yield cluster
    finally:
        gate.execute("SELECT pg_advisory_unlock_all()")
        cluster.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_thread_job_never_overlaps_itself_after_its_owner_shuts_down_gracefully(
    gated_cluster: Cluster,
) -> None:
    cluster = gated_cluster
    owner = int(cluster.query("SELECT pid FROM gated_bodies")[0][0])
    os.kill(owner, signal.SIGTERM)
    # Twice the lease: long enough for a lease that nobody renews to run out and for
    # another leader to claim the next slot.
    deadline = time.monotonic() + 2 * LEASE_SECONDS + 4
    while time.monotonic() < deadline:
        started_elsewhere = cluster.query("SELECT pid FROM gated_bodies WHERE pid <> %s", owner)
        if started_elsewhere:
            break
        time.sleep(0.1)
    owner_body_still_running = _alive(owner) and cluster.query(
        "SELECT 1 FROM gated_bodies WHERE pid = %s AND ended_at IS NULL", owner
    )
    statuses = cluster.query(
        "SELECT pid, status FROM scheduler_runs WHERE job_id = 'gated' ORDER BY id"
    )
    assert not (started_elsewhere and owner_body_still_running), (
        f"process {started_elsewhere[0][0]} started the gated job while the body of "
        f"process {owner} (shutting down) still ran; runs: {statuses}"
    )
