"""A hung leader is replaced within the lease plus a tick wherever it hangs, also
between a statement of its own and that statement's commit (the tick's heartbeat):
the transaction it left open holds the leadership row, and the promotion of the next
leader must not wait for a commit that a stopped process will not send."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from ..procs.cluster import LEADER_TICK_SECONDS, LEASE_SECONDS, PROBE_TABLE_SQL, Cluster

pytestmark = pytest.mark.multiprocess

# The heartbeat's UPDATE takes a moment more on the server (a slow disk, a busy
# server): it has locked the leadership row and not yet answered. A stop then leaves its
# transaction open, as a stop between the answer and the COMMIT does.
_SLOW_HEARTBEAT_SQL = [
    "CREATE FUNCTION slow_heartbeat() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN PERFORM pg_sleep(0.4); RETURN NULL; END $$",
    "CREATE TRIGGER slow_heartbeat AFTER UPDATE ON scheduler_leadership FOR EACH ROW"
    " WHEN (OLD.term = NEW.term) EXECUTE FUNCTION slow_heartbeat()",
]
_HEARTBEAT_UNDER_WAY = (
    "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
    " AND query LIKE 'UPDATE scheduler_leadership SET heartbeat_at%%'"
)
_HEARTBEAT_LEFT_OPEN = (
    "SELECT count(*) FROM pg_stat_activity WHERE state IN ('active', 'idle in transaction')"
    " AND query LIKE 'UPDATE scheduler_leadership SET heartbeat_at%%'"
)
_WAITING = (
    "SELECT application_name, left(regexp_replace(query, '\\s+', ' ', 'g'), 80)"
    " FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
)


@pytest.fixture
def cluster(database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(PROBE_TABLE_SQL)
    cluster = Cluster(database_url, tmp_path)
    cluster.start()
    try:
        cluster.leader(timeout=60)
        cluster.wait_for(lambda: cluster.query("SELECT 1 FROM probe_fires LIMIT 1"), 30, "a fire")
        with psycopg.connect(database_url, autocommit=True) as conn:
            for statement in _SLOW_HEARTBEAT_SQL:
                conn.execute(statement.encode())
        yield cluster
    finally:
        cluster.stop()


def test_a_leader_hung_with_its_heartbeat_uncommitted_is_replaced_within_the_lease_and_a_tick(
    cluster: Cluster,
) -> None:
    leader = cluster.leader()
    for _ in range(20):
        cluster.wait_for(
            lambda: cluster.query(_HEARTBEAT_UNDER_WAY)[0][0] > 0, 10, "a heartbeat under way"
        )
        os.kill(leader, signal.SIGSTOP)
        stopped_at = time.time()
        time.sleep(0.5)
        if cluster.query(_HEARTBEAT_LEFT_OPEN)[0][0] > 0:
            break
        os.kill(leader, signal.SIGCONT)
    else:
        pytest.fail("the leader was never stopped with its heartbeat uncommitted")
    deadline = stopped_at + LEASE_SECONDS + LEADER_TICK_SECONDS + 1
    try:
        while not (replaced := cluster.fires_by_other_than(leader, stopped_at) > 0):
            if time.time() > deadline:
                break
            time.sleep(0.05)
        waiting = cluster.query(_WAITING)
    finally:
        os.kill(leader, signal.SIGCONT)
    assert replaced, (
        f"no fire by another process within the lease and a tick of the stop; the key is "
        f"held by {cluster.holders()}, and these wait on a lock: {waiting}"
    )
