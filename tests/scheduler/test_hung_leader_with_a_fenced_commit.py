"""A hung leader is replaced within the lease plus a tick even when it hangs inside a
fenced transaction (a job that took ``ctx.fence`` and had not committed yet): the
promotion that waits for fenced commits under way must not wait for the commit of a
process that no longer runs, or nothing fires until that process resumes. Resumed, that
process fires nothing, and the fenced commit it had under way never lands."""

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

# A fenced transaction between its fence and its commit: idle in transaction, its last
# statement the write it fenced.
_FENCED_OPEN = (
    "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
    " AND query LIKE 'INSERT INTO fenced_commits%%'"
)
_FENCED_COMMITS_OF = "SELECT count(*) FROM fenced_commits WHERE pid = %s"

_WAITING = (
    "SELECT application_name, left(regexp_replace(query, '\\s+', ' ', 'g'), 80)"
    " FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
)


@pytest.fixture
def cluster(database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(PROBE_TABLE_SQL)
        conn.execute(b"CREATE TABLE fenced_commits (slot timestamptz NOT NULL, pid integer)")
    cluster = Cluster(database_url, tmp_path, app="tests.procs.fenced_app:app")
    cluster.start()
    try:
        cluster.leader(timeout=60)
        cluster.wait_for(lambda: cluster.query("SELECT 1 FROM probe_fires LIMIT 1"), 30, "a fire")
        yield cluster
    finally:
        cluster.stop()


def test_a_leader_hung_in_a_fenced_commit_is_replaced_in_the_lease_and_a_tick_and_it_never_lands(
    cluster: Cluster,
) -> None:
    leader = cluster.leader()
    # Stopped inside the fenced transaction: seen open after the stop (else resumed and
    # stopped again at the next one).
    for _ in range(20):
        cluster.wait_for(
            lambda: cluster.query(_FENCED_OPEN)[0][0] > 0, 10, "a fenced commit under way"
        )
        os.kill(leader, signal.SIGSTOP)
        stopped_at = time.time()
        if cluster.query(_FENCED_OPEN)[0][0] > 0:
            committed_before = cluster.query(_FENCED_COMMITS_OF, leader)
            break
        os.kill(leader, signal.SIGCONT)
    else:
        pytest.fail("the leader was never stopped inside its fenced transaction")
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
    # Resumed, it steps down: its fenced commit under way at the stop never lands (the
    # new term began while it was stopped), and it fires nothing more.
    cluster.wait_for(lambda: "scheduler.demoted" in cluster.log_of(leader), 10, "the demotion")
    resumed = time.time()
    cluster.wait_for(
        lambda: cluster.fires_by_other_than(leader, resumed) >= 3, 10, "fires after SIGCONT"
    )
    late = cluster.query(
        "SELECT count(*) FROM probe_fires WHERE pid = %s AND fired_at > to_timestamp(%s)",
        leader,
        stopped_at,
    )
    assert (cluster.query(_FENCED_COMMITS_OF, leader), late) == (committed_before, [(0,)])
    [successor] = cluster.holders()
    assert "scheduler.old_term_transaction_ended" in cluster.log_of(successor)
