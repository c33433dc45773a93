"""Workers waiting behind their host's lock file are counted as standbys: `leader`
tells them apart from the sessions waiting for the key, and a waiter that dies leaves
the count within a lease."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psycopg
import pytest

from tests.procs.cluster import LEASE_SECONDS, Cluster

from .conftest import one_host_queued_one

pytestmark = pytest.mark.multiprocess


def _leader(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", "leader", *args],
        env={**os.environ, "DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _standbys(url: str) -> tuple[int, int, int]:
    info = json.loads(_leader(url, "--json").stdout)
    return info["standbys"], info["standbys_on_key"], info["standbys_behind_host_lock"]


def test_workers_behind_the_host_lock_are_counted_as_standbys_apart_from_the_key(
    one_host: Cluster, key_held_elsewhere: psycopg.Connection[tuple[object, ...]]
) -> None:
    one_host.wait_for(lambda: one_host_queued_one(one_host), 30, "one worker queued")
    one_host.wait_for(lambda: _standbys(one_host.url) == (3, 1, 2), 15, "three standbys counted")
    told = _leader(one_host.url)
    assert told.returncode == 0, told.stderr
    assert "3 standbys: 1 on the key, 2 behind the host lock" in told.stdout


def test_a_worker_killed_behind_the_host_lock_leaves_the_count_within_a_lease(
    one_host: Cluster, key_held_elsewhere: psycopg.Connection[tuple[object, ...]]
) -> None:
    one_host.wait_for(lambda: one_host_queued_one(one_host), 30, "one worker queued")
    one_host.wait_for(lambda: _standbys(one_host.url) == (3, 1, 2), 15, "three standbys counted")
    [queued] = one_host.queued()
    waiter = next(pid for pid in one_host.processes if pid != queued)
    os.kill(waiter, signal.SIGKILL)
    one_host.wait_for(
        lambda: _standbys(one_host.url) == (2, 1, 1),
        LEASE_SECONDS + 5,
        "the killed waiter gone from the count within a lease",
    )
