"""Delivered-row retention: an outbox's delivered rows deleted in short batches.

A row goes once it was delivered more than ``days`` ago on the lease clock (the
database server's, or a test's FakeClock). Only ``delivered`` rows ever go: a pending
row is work still owed, and a stuck row waits for an operator, so retention leaves both
whatever their age. The key of a deleted row is free again: an enqueue of that key
after its row went is a new message (the key deduplicates for as long as its row is
kept).

Each batch is one statement that locks at most ``batch`` rows with SKIP LOCKED and
deletes them, committed on its own: no lock is held longer than that statement, a row
another transaction holds is left for the next pass, and a pass killed mid-way has
committed every batch before the kill. The walk follows ``outbox_messages_delivered``
(outbox, delivered_at; delivered rows only) from the oldest delivery and stops at the
cutoff.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.scheduler.clock import LEASE_NOW_SQL

__all__ = [
    "DELIVERY_COUNTS_KEPT_SECONDS",
    "count_prunable_delivered",
    "forget_old_delivery_counts",
    "outboxes_of",
    "prune_delivered_batch",
]

DELIVERY_COUNTS_KEPT_SECONDS = 86400
"""How long the per-minute delivery counts (outbox_delivered_minutes, kept by the
database as rows are delivered) are kept: a day, past any window an operator surface
sums (the last hour)."""

# The cutoff is read once (a scalar subquery) so that it bounds the index scan.
_PRUNABLE = f"""
    SELECT id FROM outbox_messages
    WHERE outbox = :outbox AND status = 'delivered'
        AND delivered_at < (SELECT {LEASE_NOW_SQL}
            - make_interval(secs => CAST(:days AS double precision) * 86400))
    """

_PRUNE_BATCH = text(
    f"""
    DELETE FROM outbox_messages WHERE id IN (
        {_PRUNABLE} ORDER BY delivered_at LIMIT :batch FOR UPDATE SKIP LOCKED)
    """
)

_COUNT = text(f"SELECT count(*) FROM ({_PRUNABLE}) prunable")

_FORGET_OLD_COUNTS = text(
    f"""
    DELETE FROM outbox_delivered_minutes
    WHERE outbox = :outbox AND minute < (SELECT {LEASE_NOW_SQL}
        - make_interval(secs => {DELIVERY_COUNTS_KEPT_SECONDS}))
    """
)

_OUTBOXES_OF = text(
    "SELECT outbox FROM outbox_schedules WHERE schedule = :schedule ORDER BY outbox"
)


async def outboxes_of(session: AsyncSession, schedule: str) -> list[str]:
    """The names of the outboxes the schedule ``schedule`` drains (each outbox name
    belongs to one schedule per database: Outbox.claim_name)."""
    async with session.begin():
        return list((await session.execute(_OUTBOXES_OF, {"schedule": schedule})).scalars())


async def prune_delivered_batch(
    session: AsyncSession,
    *,
    outbox: str,
    days: float,
    batch: int,
    lease_now: datetime | None = None,
) -> int:
    """Delete at most ``batch`` of ``outbox``'s rows delivered more than ``days`` ago,
    in one transaction of one statement, committed before this returns; the number
    deleted. ``lease_now`` as clock.lease_now gives it (None: the database server's
    clock)."""
    async with session.begin():
        params = {"outbox": outbox, "days": days, "batch": batch, "lease_now": lease_now}
        result = await session.execute(_PRUNE_BATCH, params)
    deleted: int = result.rowcount  # type: ignore[attr-defined]
    return deleted


async def forget_old_delivery_counts(
    session: AsyncSession, *, outbox: str, lease_now: datetime | None = None
) -> None:
    """Delete ``outbox``'s per-minute delivery counts older than
    DELIVERY_COUNTS_KEPT_SECONDS (a few rows an hour), committed before this returns."""
    async with session.begin():
        await session.execute(_FORGET_OLD_COUNTS, {"outbox": outbox, "lease_now": lease_now})


async def count_prunable_delivered(
    session: AsyncSession, *, outbox: str, days: float, lease_now: datetime | None = None
) -> int:
    """How many of ``outbox``'s rows a prune would delete now; deletes nothing."""
    async with session.begin():
        params = {"outbox": outbox, "days": days, "lease_now": lease_now}
        count: int = (await session.execute(_COUNT, params)).scalar_one()
    return count
