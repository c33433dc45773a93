"""Three (or more) real app processes on one database, and helpers to read what they did.

Used by the multi-process fault tests and by bench/failover.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from app.localpg import free_port
from app.scheduler.keys import LEADER_KEY_LOCKS

LEASE_SECONDS = 4
LEADER_TICK_SECONDS = 1
PROJECT_ROOT = Path(__file__).resolve().parents[2]

PROBE_TABLE_SQL = (
    "CREATE TABLE probe_fires (slot timestamptz NOT NULL, pid int NOT NULL,"
    " fired_at timestamptz NOT NULL DEFAULT clock_timestamp())"
)

HOLDER_SQL = f"""
    SELECT a.application_name FROM pg_stat_activity a
    WHERE a.pid IN (SELECT pid FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND granted)
"""
QUEUED_SQL = f"""
    SELECT a.application_name FROM pg_stat_activity a
    WHERE a.pid IN (SELECT pid FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND NOT granted)
"""


@dataclass
class Cluster:
    """Three app processes on one database, with helpers to read what they did.

    ``env`` overrides the processes' settings. Each process is a host of its own (its
    own REGENT_RUNTIME_DIR) unless start() is given a runtime directory to share.
    """

    url: str
    log_dir: Path
    app: str = "tests.procs.probe_app:app"
    env: dict[str, str] = field(default_factory=dict)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, count: int = 3, runtime_dir: Path | None = None) -> None:
        """Start ``count`` processes; with ``runtime_dir``, as workers of one host."""
        env = {
            **os.environ,
            "DATABASE_URL": self.url,
            "ENVIRONMENT": "test",
            "LOG_LEVEL": "INFO",
            "LEASE_SECONDS": str(LEASE_SECONDS),
            "LEADER_TICK_SECONDS": str(LEADER_TICK_SECONDS),
            "HANDOVER_GRACE_SECONDS": "0.5",
            "SHUTDOWN_GRACE_SECONDS": "1",
            **self.env,
        }
        for _ in range(count):
            port = free_port()
            host = runtime_dir or self.log_dir / f"host-{port}"
            with open(self.log_dir / f"app-{port}.log", "wb") as log:
                process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "uvicorn",
                        self.app,
                        "--host",
                        "127.0.0.1",
                        "--port",
                        str(port),
                        "--workers",
                        "1",
                    ],
                    cwd=PROJECT_ROOT,
                    env={**env, "REGENT_RUNTIME_DIR": str(host)},
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
            rows = self.query(HOLDER_SQL)
        except psycopg.OperationalError:
            return []
        return [int(str(name).rsplit(":", 1)[1]) for (name,) in rows]

    def wait_for(self, predicate: Callable[[], object], timeout: float, what: str) -> float:
        """Poll ``predicate`` until true; returns the seconds it took."""
        started = time.monotonic()
        while not predicate():
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

    def first_fire_after(self, since: float, excluding: int | None = None) -> float | None:
        """Epoch seconds of the first fire after ``since``, by a process other than
        ``excluding``; None while there is none."""
        rows = self.query(
            "SELECT extract(epoch FROM min(fired_at)) FROM probe_fires"
            " WHERE pid <> %s AND fired_at > to_timestamp(%s)",
            excluding if excluding is not None else -1,
            since,
        )
        return None if rows[0][0] is None else float(rows[0][0])

    def queued(self) -> list[int]:
        """pids of the processes whose lock connection waits for the key."""
        rows = self.query(QUEUED_SQL)
        return [int(str(name).rsplit(":", 1)[1]) for (name,) in rows]

    def lock_connections(self) -> int:
        """How many lock connections (leader or queued) are open on this database."""
        rows = self.query(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND starts_with(application_name, 'scheduler-leader:')"
        )
        return int(rows[0][0])

    def lock_backend_pid(self) -> int:
        """Backend pid of the leader's lock connection."""
        rows = self.query(f"SELECT pid FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND granted")
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
