"""The host lock has a lease too: a worker that holds its host's lock file but hangs
(SIGSTOP, a blocked event loop) is passed by the other workers of its host once its
lock connection has been gone from the server for a lease, so that a hung standby
cannot keep its host from leading after the leader elsewhere went away."""

import os
import signal
import time

import psycopg
import pytest

from tests.procs.cluster import LEADER_TICK_SECONDS, LEASE_SECONDS, Cluster

from .conftest import one_host_queued_one

pytestmark = pytest.mark.multiprocess


def test_a_hung_host_lock_holder_is_passed_once_its_lock_connection_is_gone(
    one_host: Cluster, key_held_elsewhere: psycopg.Connection[tuple[object, ...]]
) -> None:
    one_host.wait_for(lambda: one_host_queued_one(one_host), 30, "one worker queued")
    [hung] = one_host.queued()
    os.kill(hung, signal.SIGSTOP)
    # The leader elsewhere goes away: the hung worker's backend is granted the key and,
    # idle, is ended by the server a lease later; a lease after that (on the server's
    # clock, looked at every tick) another worker of the host queues past the lock file,
    # leads after the handover grace (0.5 s) and fires the next 1 s slot.
    key_held_elsewhere.execute("SELECT pg_advisory_unlock_all()")
    released = time.time()
    one_host.wait_for(
        lambda: one_host.fires_by_other_than(hung, released) > 0,
        2 * LEASE_SECONDS + LEADER_TICK_SECONDS + 3,
        "a fire by another worker of the host within two leases and a tick",
    )
    os.kill(hung, signal.SIGCONT)
    resumed = time.time()
    one_host.wait_for(
        lambda: one_host.fires_by_other_than(hung, resumed) >= 3, 10, "fires after SIGCONT"
    )
    assert one_host.query("SELECT count(*) FROM probe_fires WHERE pid = %s", hung) == [(0,)]
    assert len(one_host.holders()) == 1
    assert one_host.slots_fired_twice() == []


def test_workers_never_pass_a_host_lock_holder_whose_lock_connection_is_listed(
    one_host: Cluster,
) -> None:
    """The count runs only while the holder's lock connection is gone: a holder queued
    for the key is not passed however long it waits, so the host keeps one lock
    connection."""
    one_host.wait_for(lambda: one_host_queued_one(one_host), 30, "one worker queued")
    watched_until = time.monotonic() + LEASE_SECONDS + 2 * LEADER_TICK_SECONDS
    while time.monotonic() < watched_until:
        assert one_host.lock_connections() == 1
        time.sleep(0.1)
    assert not any(
        "scheduler.host_lock_passed" in one_host.log_of(pid) for pid in one_host.processes
    )
