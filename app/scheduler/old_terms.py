"""What is left of a previous leader, seen through the app's engine: whether a host
lock holder's lock connection is still listed on the server, and ending the
transactions an old term left holding the leadership row."""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from .clock import LEASE_NOW_SQL
from .election import application_name
from .faults import LOCK_CONNECTION_ERRORS
from .host_lock import Holder

__all__ = ["end_old_term_transactions", "lock_connection_listed"]

logger = logging.getLogger("app.scheduler")

# Whether a host lock's holder still has its lock connection on the server (its backend,
# under the holder's application_name), and the lease clock's now to count its absence.
_LISTED_SQL = text(f"""
    SELECT EXISTS (
        SELECT 1 FROM pg_stat_activity
        WHERE pid = CAST(:backend_pid AS integer) AND application_name = :name),
        {LEASE_NOW_SQL}
    """)


async def lock_connection_listed(
    engine: AsyncEngine, holder: Holder, *, lease_now: datetime | None, timeout: float
) -> tuple[bool, datetime] | None:
    """Whether ``holder``'s lock connection is listed on the server (a holder with no
    backend pid yet has none), and the lease clock's now (``lease_now``; None: the
    server's clock). None when the server does not answer within ``timeout``: no
    evidence either way. Asked through the app's engine (``engine``) by the workers
    waiting for their host's lock file (host_lock.HostLock.acquire)."""
    try:
        async with asyncio.timeout(timeout), engine.connect() as conn:
            row = (
                await conn.execute(
                    _LISTED_SQL,
                    {
                        "backend_pid": holder.backend_pid,
                        "name": application_name(holder.pid),
                        "lease_now": lease_now,
                    },
                )
            ).one()
    except (SQLAlchemyError, *LOCK_CONNECTION_ERRORS):
        return None
    listed, now = row
    return bool(listed), now


# The transactions that keep a promotion's record (on lock backend :backend_pid) waiting
# for the leadership row, ended: those that hold the row (FOR KEY SHARE: a fence; an
# UPDATE: a heartbeat) and nothing stronger on its table (never a migration's DDL).
_END_TERM_BLOCKERS = text(
    """
    SELECT a.pid, a.application_name, a.state,
        left(regexp_replace(a.query, '\\s+', ' ', 'g'), 100) AS query,
        pg_terminate_backend(a.pid) AS ended
    FROM pg_stat_activity a
    WHERE a.pid = ANY(pg_blocking_pids(CAST(:backend_pid AS integer)))
        AND EXISTS (
            SELECT 1 FROM pg_locks l
            WHERE l.pid = a.pid AND l.granted
                AND l.relation = CAST('scheduler_leadership' AS regclass)
                AND l.mode IN ('RowShareLock', 'RowExclusiveLock'))
        AND NOT EXISTS (
            SELECT 1 FROM pg_locks l
            WHERE l.pid = a.pid AND l.relation = CAST('scheduler_leadership' AS regclass)
                AND l.mode NOT IN ('AccessShareLock', 'RowShareLock', 'RowExclusiveLock'))
    """
)


async def end_old_term_transactions(
    engine: AsyncEngine, backend_pid: int, *, waited: float, timeout: float
) -> None:
    """End the transactions that keep the promotion on lock backend ``backend_pid``
    waiting for the leadership row (``record_leadership``) after it ``waited`` seconds:
    a job's fenced transaction (``ctx.fence``) or a heartbeat left open by a process
    that no longer holds the key (SIGSTOP, a paused VM, a blocked loop). Their term is
    over, so by the fence they must not commit after the new one begins: ending them
    keeps that (their commit never lands), where waiting would keep every job from
    firing for as long as that process hangs. Each is logged
    (``scheduler.old_term_transaction_ended``). Asked through the app's engine, whose
    role owns those transactions (the lock connection's is busy waiting); an error or
    no answer within ``timeout`` is logged, and the caller asks again."""
    try:
        async with asyncio.timeout(timeout), engine.connect() as conn:
            ended = list(await conn.execute(_END_TERM_BLOCKERS, {"backend_pid": backend_pid}))
    except (SQLAlchemyError, TimeoutError) as exc:
        logger.warning(
            "scheduler.term_blocked: the promotion has waited %.1f s for the leadership row "
            "and could not end the transactions that hold it (%s); end them (see "
            "pg_blocking_pids(%s)), or grant the app's role pg_signal_backend",
            waited,
            exc,
            backend_pid,
            extra={"action": "scheduler.term_blocked", "pid": os.getpid()},
        )
        return
    for row in ended:
        logger.warning(
            "scheduler.old_term_transaction_ended: the promotion waited %.1f s for backend "
            "%s (%r, %s: %s), which holds the leadership row for an older term; ended it, "
            "so its commit never lands after the new term begins (ended: %s)",
            waited,
            row.pid,
            row.application_name,
            row.state,
            row.query,
            row.ended,
            extra={
                "action": "scheduler.old_term_transaction_ended",
                "pid": os.getpid(),
                "backend_pid": row.pid,
            },
        )
