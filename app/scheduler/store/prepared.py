"""A claim prepared ahead of its slot (PreparedCommit): its statements run early and its
transaction holds the claimed rows until the slot; only the commit is left for then."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..clock import LEASE_NOW_SQL, Clock
from ..keys import LEADER_KEY_LOCKS_BOUND
from .base import StoreBase

__all__ = ["PreparedClaimDropped", "PreparedCommit"]

# A prepared claim's transaction idles until its slot: the server ends the session if it
# idles a few seconds longer than planned (its process froze), which rolls the claim
# back. It also reads the server's moment of the start (now + lead).
_PREPARE = text(
    "SELECT set_config('idle_in_transaction_session_timeout', :ms, true) AS idle_limit,"
    " clock_timestamp() + make_interval(secs => CAST(:lead AS double precision)) AS at_start"
)
_PREPARED_IDLE_SLACK = 3.0
# A prepared claim's fence, checked again right before it commits.
_STILL_FENCED = text(
    f"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE {LEADER_KEY_LOCKS_BOUND}"
    " AND granted AND pid = :fence_pid)"
)

# The runs of a prepared claim that committed late start when it commits, and their
# running leases (on their run rows, copied to their job rows) run from then (on the
# lease clock; :leased_at is the moment the claim took them as of): the body's first
# renewal is due a third of a lease after it starts.
_RESTAMP_START = text(
    f"""
    WITH runs AS (
        UPDATE scheduler_runs
        SET started_at = CAST(:started AS timestamptz),
            lateness_ms = lateness_ms + CAST(:late_ms AS bigint),
            running_until = GREATEST(running_until,
                {LEASE_NOW_SQL} + (running_until - CAST(:leased_at AS timestamptz)))
        WHERE id = ANY(CAST(CAST(:run_ids AS text[]) AS bigint[]))
        RETURNING id, running_until
    )
    UPDATE scheduler_jobs j
    SET last_started_at = CAST(:started AS timestamptz),
        running_since = CAST(:started AS timestamptz),
        running_until = runs.running_until
    FROM runs
    WHERE j.running_run_id = runs.id
    """
)


class PreparedClaimDropped(Exception):
    """A prepared claim was rolled back before its commit: the leadership it was made
    for ended while it waited. It claimed nothing; the next leader claims its slots."""


@dataclass
class PreparedCommit:
    """When a prepared claim commits: its statements run at once, then its transaction
    stays open until ``commit_at`` on ``clock`` (wait()), and commits; a cancel
    meanwhile, or ``dropped`` set by then (the leadership it was made for ended), rolls
    it back, claiming nothing. What the waiter needs to know it reads here, and nothing
    is called back: ``committing`` is set (and ``began_at``, on time.perf_counter, the
    cost of a commit being measured) once the wait is over and the claim commits.

    ``starts_at``: the instant the bodies are meant to start, written as the runs'
    start (the clock is read before each write, so that a preparation that outlasts its
    lead records when the runs really start). ``seconds``: about how long the
    transaction waits: the server ends its session when it idles in the transaction a
    second longer (a frozen process must not hold job rows for good).
    """

    starts_at: datetime
    commit_at: datetime
    clock: Clock
    seconds: float
    dropped: asyncio.Event = field(default_factory=asyncio.Event)
    committing: asyncio.Event = field(default_factory=asyncio.Event)
    began_at: float | None = None

    def now(self) -> datetime:
        """The clock's reading now."""
        return self.clock.now()

    def start(self) -> datetime:
        """The runs' start as of now: the planned instant, or later if it passed."""
        return max(self.starts_at, self.now())

    async def wait(self) -> None:
        """Wait until ``commit_at`` (checked again after each sleep: a wall clock
        slewed or stepped back ends a sleep early), then raise PreparedClaimDropped if
        ``dropped`` is set, else mark the commit begun."""
        while (ahead := (self.commit_at - self.clock.now()).total_seconds()) > 0:
            await self.clock.sleep(ahead)
        if self.dropped.is_set():
            raise PreparedClaimDropped
        self.began_at = time.perf_counter()
        self.committing.set()


async def begin_prepared(
    store: StoreBase, conn: AsyncConnection, prepared: PreparedCommit
) -> tuple[datetime, dict[str, object]]:
    """Open ``conn``'s transaction as ``prepared``'s: the server ends it if it idles
    past the planned wait. Returns the claim's ``now`` (its start) and the lease
    clock's reading as of that start."""
    now = prepared.start()
    # Leases are reaped, compared and taken as of the start the claim waits for: on
    # the server's clock, its moment as far ahead of the server's now as the start is
    # ahead of ours.
    lead = max(0.0, (now - prepared.now()).total_seconds())
    idle_ms = int((prepared.seconds + _PREPARED_IDLE_SLACK) * 1000)
    at_start = (await conn.execute(_PREPARE, {"ms": str(idle_ms), "lead": lead})).one().at_start
    return now, store.lease_params(now) if store.lease_clock else {"lease_now": at_start}


async def commit_prepared(
    store: StoreBase,
    conn: AsyncConnection,
    prepared: PreparedCommit,
    fence_pid: int | None,
    run_ids: Iterable[int],
    was: datetime,
    leased_at: object,
) -> None:
    """Wait for ``prepared``'s commit (its ``wait()``), then leave the claim in
    ``conn`` ready to commit: raises PreparedClaimDropped (it is rolled back) when the
    lock connection ``fence_pid`` lost the key meanwhile. A commit later than ``was``
    (the start its rows say) restamps the started runs ``run_ids`` (their leases taken
    as of ``leased_at``): they start at the commit, and hold a whole lease from then."""
    await prepared.wait()
    if fence_pid is not None:
        params = {"fence_pid": fence_pid} | store.key.bind_params
        if not (await conn.execute(_STILL_FENCED, params)).scalar_one():
            raise PreparedClaimDropped
    started = prepared.now()
    if started <= was:
        return
    # The commit comes late (a busy loop, a slow preparation).
    ids = [str(run_id) for run_id in run_ids]
    if ids:
        await conn.execute(
            _RESTAMP_START,
            {
                "run_ids": ids,
                "started": started,
                "late_ms": int((started - was).total_seconds() * 1000),
                "leased_at": leased_at,
            }
            | store.lease_params(started),
        )
