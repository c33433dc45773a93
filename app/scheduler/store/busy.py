"""A job row held by another transaction: the rows of a claim or a registration are
locked only where free, and a held one is named, never waited on."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import JobRowBusyError
from .base import StoreBase

__all__ = ["FREE_ROWS", "HELD_ROWS", "lock_free_rows"]

# The rows of a claim's jobs that no other transaction holds, locked as the claim's
# UPDATE would lock them (a CTE, ``free``): the claim updates only these. A row held
# elsewhere (an operator's psql session left open on SELECT ... FOR UPDATE) is skipped,
# never waited on, whatever lock_timeout the database sets (none by default): a wait
# there would hold up every job of the claim, and the timer's every later wake, for as
# long as the row is held. Never waiting, a claim also never deadlocks on job rows.
FREE_ROWS = (
    "free AS MATERIALIZED (SELECT id, running_until FROM scheduler_jobs"
    " WHERE schedule = :schedule AND id = ANY(CAST(:ids AS text[]))"
    " FOR NO KEY UPDATE SKIP LOCKED)"
)
# Of the rows of ``ids``, those ``free`` could not lock: another transaction holds them
# (a job with no row is not busy: its claim matches nothing). In the statement that
# locks, so a claim or a registration pays one round trip for the busy-row rule (a
# claim's is reap.lock_and_reap, which also finds the leases to reap).
HELD_ROWS = (
    "SELECT id FROM scheduler_jobs WHERE schedule = :schedule"
    " AND id = ANY(CAST(:ids AS text[])) AND id NOT IN (SELECT id FROM free)"
)
_LOCK_FREE_ROWS = text(f"WITH {FREE_ROWS} {HELD_ROWS}")


async def lock_free_rows(
    store: StoreBase, conn: AsyncConnection, ids: list[str]
) -> dict[str, JobRowBusyError]:
    """Lock the rows of ``ids`` that no other transaction holds, without waiting, in
    one statement; return the error of each job whose row is held elsewhere."""
    params = {"ids": ids, "schedule": store.schedule}
    held = await conn.execute(_LOCK_FREE_ROWS, params)
    return {row.id: JobRowBusyError(row.id) for row in held}
