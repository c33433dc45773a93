"""The one classification of database errors the scheduler acts on.

Three answers, each decided here and nowhere else:

- *unreachable*: the server cannot be reached, is going away, has ended the
  connection or is full. A passing outage: retried with the DATABASE backoff, whatever
  ENVIRONMENT says.
- *a busy row*: a claim left out a row another transaction holds
  (JobRowBusyError: a claim never waits on one), or a statement met such a row (a lock
  or statement timeout cut it off, a deadlock, a serialization failure). Passing too:
  the row is busy, not bad, and its job is tried again within a tick; an operator's
  write answers 409 "try again".
- *the job's fault*: the job's step failed while the database answers (its trigger
  raised, its row refused the statement). The job is broken (broken.py) and every
  other job keeps firing.

The lock connection's own statements answer a fourth question (did the connection die
under this statement?), LOCK_CONNECTION_ERRORS: any of them counts as a lost or
unanswered lock, in doubt against leading.
"""

from __future__ import annotations

import asyncpg
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import JobRowBusyError

__all__ = [
    "BUSY_ROW_SQLSTATES",
    "LOCK_CONNECTION_ERRORS",
    "UNREACHABLE",
    "blames_job",
    "database_answers",
    "is_busy_row",
]

# The server cannot be reached, is going away or is full. A statement begun on a
# connection the server ended between statements (a terminated backend, a restart)
# raises InternalClientError: asyncpg has read the server's FATAL but not yet the close.
UNREACHABLE = (
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.InternalClientError,
)

# What a statement on the lock connection raises when the connection dies under it:
# any server error counts too (the statement went unanswered).
LOCK_CONNECTION_ERRORS = (*UNREACHABLE, asyncpg.PostgresError)

# lock_not_available, query_canceled (a statement_timeout), deadlock_detected,
# serialization_failure.
BUSY_ROW_SQLSTATES = frozenset({"55P03", "57014", "40P01", "40001"})


def is_busy_row(exc: BaseException) -> bool:
    """True when ``exc`` says a row (a job's, an outbox's) is held by another
    transaction: a claim left it out, or a statement that met it was cut off. ``exc``
    is SQLAlchemy's error or, from a bare asyncpg connection (a drain pass), asyncpg's."""
    if isinstance(exc, JobRowBusyError):
        return True
    if isinstance(exc, DBAPIError):
        return getattr(exc.orig, "sqlstate", None) in BUSY_ROW_SQLSTATES
    return isinstance(exc, asyncpg.PostgresError) and exc.sqlstate in BUSY_ROW_SQLSTATES


async def database_answers(engine: AsyncEngine, exc: BaseException) -> bool:
    """True when ``exc`` came from a database that still answers: not a lost
    connection, and a fresh connection of ``engine`` runs a statement. Never raises."""
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return False
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    except Exception:
        return False
    return True


async def blames_job(engine: AsyncEngine, exc: BaseException) -> bool:
    """True when a job's step failed with ``exc`` by the job's own fault: the database
    answers and the row was not merely busy. Never raises."""
    if is_busy_row(exc):
        return False
    return await database_answers(engine, exc)
