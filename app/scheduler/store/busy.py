"""A job row held by another transaction: the rows of a claim or a registration are
locked only where free, and a held one is named, never waited on."""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import JobRowBusyError
from .base import StoreBase

__all__ = ["lock_free_rows"]

# The rows of a claim's jobs that no other transaction holds, locked as the claim's
# UPDATE would lock them: the claim updates only these. A row held elsewhere (an
# operator's psql session left open on SELECT ... FOR UPDATE) is skipped, never waited
# on, whatever lock_timeout the database sets (none by default): a wait there would
# hold up every job of the claim, and the timer's every later wake, for as long as the
# row is held. Never waiting, a claim also never deadlocks on job rows.
_LOCK_FREE_ROWS = text(
    "SELECT id FROM scheduler_jobs WHERE schedule = :schedule"
    " AND id = ANY(CAST(:ids AS text[])) FOR NO KEY UPDATE SKIP LOCKED"
)
# Of the jobs a claim could not lock, those that have a row: it is held elsewhere.
_STORED_IDS = text(
    "SELECT id FROM scheduler_jobs WHERE schedule = :schedule AND id = ANY(CAST(:ids AS text[]))"
)


async def lock_free_rows(
    store: StoreBase, conn: AsyncConnection, ids: list[str]
) -> dict[str, JobRowBusyError]:
    """Lock the rows of ``ids`` that no other transaction holds, without waiting;
    return the error of each job whose row is held elsewhere (a job with no row is
    not busy: its claim matches nothing)."""
    params = {"ids": ids, "schedule": store.schedule}
    free = {row.id for row in await conn.execute(_LOCK_FREE_ROWS, params)}
    left_out = [job_id for job_id in ids if job_id not in free]
    if not left_out:
        return {}
    held = await conn.execute(_STORED_IDS, params | {"ids": left_out})
    return {row.id: JobRowBusyError(row.id) for row in held}
