"""Rows another transaction holds: how long a write waits for one, and who holds it.

A row can be held for as long as anyone likes (an operator's psql session left open on
``SELECT ... FOR UPDATE``, a stuck script), and PostgreSQL's default is to wait for it
for as long as it is held. So no write of the engine or of an operator waits on a row
without a bound:

- the engine's own writes (a batch of outcomes or lease renewals, the outbox's outcomes)
  wait at most ``ROW_LOCK_PATIENCE`` for a row, then write each held row alone, later:
  one held row holds up no other;
- an operator's write (the admin API, page and CLI: pause, run now, an outbox reset)
  waits longer (``patient_write``: a claim may hold a job's row for up to
  CLAIM_AHEAD_SECONDS), then answers that the row is held, and by which backend.

Whether an error says "busy row" is decided by faults.is_busy_row.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import TextClause, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .faults import is_busy_row

__all__ = ["ROW_LOCK_PATIENCE", "RowHeldError", "held_by_sql", "patient_write", "row_holder"]

# For the engine's own writes, in a transaction: longer than any lock the engine itself
# holds a row for, short enough that a held row delays the others of a batch by a second.
ROW_LOCK_PATIENCE = text("SET LOCAL lock_timeout = '1s'")

# For an operator's write: a job's row is held by the leader's claim of its next slot
# from CLAIM_AHEAD_SECONDS before the slot until the slot, which is longer than a
# lock_timeout or statement_timeout a database or role may set for short statements.
# Both apply to the write's own transaction only.
_OPERATOR_PATIENCE = text(
    "SELECT set_config('lock_timeout', '10s', true), set_config('statement_timeout', '20s', true)"
)


def held_by_sql(xmax: str) -> str:
    """SQL for the backend pid of the open transaction that locked or is writing a row
    whose ``xmax`` column (the SQL expression ``xmax``) names it, NULL when none does:
    a row's xmax is the transaction that last locked or changed it, and a transaction
    holds a lock on its own id while it runs."""
    return (
        "(SELECT l.pid FROM pg_locks l WHERE l.locktype = 'transactionid'"
        f" AND l.mode = 'ExclusiveLock' AND l.granted AND l.transactionid = {xmax} LIMIT 1)"
    )


def row_holder(table: str, where: str) -> TextClause:
    """The statement that reads the backend pid holding the row of ``table`` that
    ``where`` selects (see held_by_sql); no row, or NULL, when none holds it."""
    return text(f"SELECT {held_by_sql('xmax')} FROM {table} WHERE {where}")


class RowHeldError(Exception):
    """A patient write met a row another transaction held past the wait (or another
    write on it: a deadlock, a serialization failure). ``held_by`` is the backend pid
    of the transaction holding it when the write gave up, None when none could be
    named (it may have let go since). Callers answer it as their own error."""

    def __init__(self, held_by: int | None) -> None:
        self.held_by = held_by
        holder = "another transaction" if held_by is None else f"backend pid {held_by}"
        super().__init__(f"the row is held by {holder}")


@asynccontextmanager
async def patient_write(
    engine: AsyncEngine, holder: TextClause, params: Mapping[str, Any]
) -> AsyncIterator[AsyncConnection]:
    """A transaction for an operator's write of one row: its statements wait at most
    10 s for a row another transaction holds (and run at most 20 s). When the row stays
    held past that, or the write met another on it, the transaction is rolled back and
    RowHeldError is raised, naming the backend that ``holder`` (a row_holder statement,
    run with ``params``) finds holding the row. Any other error is raised as itself."""
    try:
        async with engine.begin() as conn:
            await conn.execute(_OPERATOR_PATIENCE)
            yield conn
    except DBAPIError as exc:
        if not is_busy_row(exc):
            raise
        async with engine.connect() as conn:
            held_by = (await conn.execute(holder, dict(params))).scalar()
        raise RowHeldError(held_by) from exc
