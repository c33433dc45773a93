"""Failover: from a fault on the leader to the new leader's first fire.

Three app processes run a 1 s probe job on one database (tests/procs). For each fault
the script measures, five times, the seconds from the fault to the first fire by a
process other than the old leader (for a PostgreSQL restart: by any process), and the
seconds until another process holds the key. The fault lands at a random point of
the 1 s slot. Medians are printed beside the graceful SIGTERM handover, measured in the
same run.

    python bench/failover.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.db import migrate
from app.localpg import LocalPostgres, free_port
from tests.procs.cluster import LEASE_SECONDS, PROBE_TABLE_SQL, Cluster

Fault = Callable[[Cluster, int, LocalPostgres], None]


def _kill(cluster: Cluster, leader: int, server: LocalPostgres) -> None:
    os.kill(leader, signal.SIGKILL)


def _terminate(cluster: Cluster, leader: int, server: LocalPostgres) -> None:
    cluster.query("SELECT pg_terminate_backend(%s)", cluster.lock_backend_pid())


def _sigterm(cluster: Cluster, leader: int, server: LocalPostgres) -> None:
    os.kill(leader, signal.SIGTERM)


def _sigstop(cluster: Cluster, leader: int, server: LocalPostgres) -> None:
    os.kill(leader, signal.SIGSTOP)


def _restart(cluster: Cluster, leader: int, server: LocalPostgres) -> None:
    server.restart()


FAULTS: dict[str, tuple[Fault, bool]] = {
    # name: (fault, the old leader may fire the first slot after it)
    "SIGTERM (baseline)": (_sigterm, False),
    "kill -9": (_kill, False),
    "pg_terminate_backend": (_terminate, False),
    f"SIGSTOP (lease {LEASE_SECONDS} s)": (_sigstop, False),
    "PostgreSQL restart": (_restart, True),
}


def _measure(
    server: LocalPostgres, fault: Fault, any_process: bool, log_dir: Path
) -> tuple[float, float]:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.url_for("postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    url = server.url_for(name)
    migrate(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(PROBE_TABLE_SQL.encode())
    cluster = Cluster(url, log_dir)
    cluster.start()
    try:
        leader = cluster.leader()
        cluster.wait_for(lambda: cluster.first_fire_after(0) is not None, 20, "a first fire")
        time.sleep(random.random())
        started = time.time()
        fault(cluster, leader, server)
        excluding = None if any_process else leader
        holder = cluster.wait_for(
            lambda: cluster.holders() not in ([], [leader]) or (any_process and cluster.holders()),
            60,
            "a new holder",
        )
        cluster.wait_for(
            lambda: cluster.first_fire_after(started, excluding) is not None, 60, "a new fire"
        )
        first = cluster.first_fire_after(started, excluding)
        assert first is not None
        assert cluster.slots_fired_twice() == [], "a slot fired twice"
        return holder, first - started
    finally:
        cluster.stop()
        with psycopg.connect(server.url_for("postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="regent-bench-"))
    root.chmod(0o755)
    server = LocalPostgres(root / "data", port=free_port(), fsync=False)
    server.start()
    results: dict[str, list[tuple[float, float]]] = {}
    try:
        for label, (fault, any_process) in FAULTS.items():
            results[label] = [
                _measure(server, fault, any_process, root) for _ in range(args.repeat)
            ]
            print(f"  measured {label}: {results[label]}", file=sys.stderr)
    finally:
        server.stop()
    baseline = statistics.median(fire for _, fire in next(iter(results.values())))
    print(f"\nfault -> new holder / new leader's first fire, 1 s job, median of {args.repeat}")
    print(f"{'fault':<26} {'holder s':>9} {'fire s':>7} {'fire max s':>11} {'x baseline':>11}")
    for label, values in results.items():
        holders = statistics.median(holder for holder, _ in values)
        fires = [fire for _, fire in values]
        median = statistics.median(fires)
        print(
            f"{label:<26} {holders:>9.3f} {median:>7.3f} {max(fires):>11.3f}"
            f" {median / baseline:>11.2f}"
        )


if __name__ == "__main__":
    main()
