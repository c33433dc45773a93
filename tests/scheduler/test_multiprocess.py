"""Three real app processes on one database, and the faults a production system meets.

Each test asserts invariants (one holder, no slot fired twice, a live process fires
again), never the order of log lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from app.localpg import free_port
from app.scheduler.keys import SCHEDULER_LEADER_KEY

from ..pgserver import TestServer

pytestmark = pytest.mark.multiprocess

LEASE_SECONDS = 4
PROJECT_ROOT = Path(__file__).resolve().parents[2]

HOLDER_SQL = """
    SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.objid = %s AND l.granted
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


@dataclass
class Cluster:
    """Three app processes on one database, with helpers to read what they did."""

    url: str
    log_dir: Path
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, count: int = 3) -> None:
        env = {
            **os.environ,
            "DATABASE_URL": self.url,
            "ENVIRONMENT": "test",
            "LOG_LEVEL": "INFO",
            "LEASE_SECONDS": str(LEASE_SECONDS),
            "LEADER_TICK_SECONDS": "1",
            "HANDOVER_GRACE_SECONDS": "0.5",
            "SHUTDOWN_GRACE_SECONDS": "1",
        }
        for _ in range(count):
            port = free_port()
            with open(self.log_dir / f"app-{port}.log", "wb") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "uvicorn",
                        "tests.procs.probe_app:app",
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--workers",
                        "1",
                    ],
                    cwd=PROJECT_ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            self.processes[process.pid] = process

    def log_of(self, pid: int) -> str:
        return "\n".join(
            path.read_text(errors="replace")
            for path in self.log_dir.glob("app-*.log")
            if f"[{pid}]" in path.read_text(errors="replace")
        )

    def query(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.url, connect_timeout=2) as conn:
            return conn.execute(sql.encode(), params).fetchall()

    def holders(self) -> list[int]:
        """pids of the processes holding the key in this database."""
        try:
            rows = self.query(HOLDER_SQL, SCHEDULER_LEADER_KEY)
        except psycopg.OperationalError:
            return []
        return [int(str(name).rsplit(":", 1)[1]) for (name,) in rows]

    def wait_for(self, predicate: object, timeout: float, what: str) -> float:
        """Poll ``predicate`` until true; returns the seconds it took."""
        started = time.monotonic()
        while not predicate():  # type: ignore[operator]
            if time.monotonic() - started > timeout:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.02)
        return time.monotonic() - started

    def leader(self, timeout: float = 20) -> int:
        self.wait_for(lambda: len(self.holders()) == 1, timeout, "a leader")
        leader = self.holders()[0]
        assert leader in self.processes
        return leader

    def fires_by_other_than(self, pid: int, since: float) -> int:
        rows = self.query(
            "SELECT count(*) FROM probe_fires WHERE pid <> %s AND fired_at > to_timestamp(%s)",
            pid,
            since,
        )
        return int(rows[0][0])

    def slots_fired_twice(self) -> list[tuple[Any, ...]]:
        return self.query(
            "SELECT slot, count(*) FROM probe_fires GROUP BY slot HAVING count(*) > 1"
        )

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def cluster(database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE probe_fires (slot timestamptz NOT NULL, pid int NOT NULL,"
            " fired_at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
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
    rows = cluster.query(
        "SELECT l.pid FROM pg_locks l WHERE l.locktype = 'advisory' AND l.objid = %s"
        " AND l.granted AND l.database = (SELECT oid FROM pg_database"
        " WHERE datname = current_database())",
        SCHEDULER_LEADER_KEY,
    )
    fault = time.time()
    cluster.query("SELECT pg_terminate_backend(%s)", rows[0][0])
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
