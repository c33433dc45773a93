"""Three real app processes on one database, and the faults a production system meets.

Each test asserts invariants (one holder, no slot fired twice, a live process fires
again), never the order of log lines.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from app.testing import TestServer

from ..procs.cluster import LEASE_SECONDS, PROBE_TABLE_SQL, Cluster

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def cluster(database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(PROBE_TABLE_SQL)
    cluster = Cluster(database_url, tmp_path)
    cluster.start()
    try:
        cluster.leader()
        # Wait until the schedule runs: the probe has fired at least once.
        cluster.wait_for(lambda: cluster.query("SELECT 1 FROM probe_fires LIMIT 1"), 20, "a fire")
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


def test_sigstopped_leader_is_replaced_and_fires_nothing_after_sigcont(cluster: Cluster) -> None:
    leader = cluster.leader()
    os.kill(leader, signal.SIGSTOP)
    stopped_at = time.time()
    cluster.wait_for(
        lambda: cluster.holders() not in ([], [leader]), LEASE_SECONDS + 5, "a takeover"
    )
    time.sleep(max(0.0, stopped_at + LEASE_SECONDS + 5 - time.time()))
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
