"""The workers waiting behind their host's lock file, counted as standbys.

A worker waiting for its host's lock file (host_lock.py) has no session waiting for
the leader key, where standbys are counted (pg_locks). So while it waits it keeps a row
of its own in ``scheduler_host_standbys`` (schedule, host, pid) with a lease on the
lease clock, written as it begins to wait and renewed at each of its checks of the
lock file's holder (every leader tick, well inside the lease), deleted once it stops
waiting (it took the file, passed a hung holder, or stopped). A worker killed or hung
while it waits leaves a row whose lease runs out: it is no longer counted, and the next
note of any worker of the schedule deletes it.

A note or a deletion that fails (the server does not answer) changes nothing but the
count, never the worker's turn: the count is what operators read, the lock file and
the key decide who leads.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import datetime

from sqlalchemy import TextClause, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from .clock import LEASE_END_SQL, LEASE_NOW_SQL
from .faults import LOCK_CONNECTION_ERRORS

__all__ = ["HOST_STANDBYS_SQL", "HostStandby"]

# The row written, or its lease renewed; rows of the schedule whose lease ran out go.
_NOTE = text(
    f"""
    WITH expired AS (
        DELETE FROM scheduler_host_standbys
        WHERE schedule = :schedule AND expires_at <= {LEASE_NOW_SQL}
            AND (host, pid) <> (CAST(:host AS text), CAST(:pid AS integer))
    )
    INSERT INTO scheduler_host_standbys (schedule, host, pid, since, expires_at)
    VALUES (:schedule, :host, :pid, {LEASE_NOW_SQL}, {LEASE_END_SQL})
    ON CONFLICT (schedule, host, pid) DO UPDATE SET expires_at = excluded.expires_at
    """
)
_DROP = text(
    "DELETE FROM scheduler_host_standbys WHERE schedule = :schedule AND host = :host AND pid = :pid"
)

HOST_STANDBYS_SQL = f"""(
    SELECT count(*) FROM scheduler_host_standbys
    WHERE schedule = CAST(:schedule AS text) AND expires_at > {LEASE_NOW_SQL})"""
"""SQL for the number of workers of schedule ``:schedule`` waiting behind their host's
lock file, read on the lease clock (``:lease_now``)."""


class HostStandby:
    """This worker's row while it waits behind its host's lock file: ``pid`` on
    ``host``, for schedule ``schedule``, with a lease of ``lease_seconds``; every
    statement gives up after ``timeout`` seconds."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        schedule: str,
        host: str,
        pid: int,
        lease_seconds: float,
        timeout: float,
    ) -> None:
        self.engine = engine
        self.timeout = timeout
        self._params: dict[str, object] = {
            "schedule": schedule,
            "host": host,
            "pid": pid,
            "lease_seconds": lease_seconds,
        }

    async def note(self, lease_now: datetime | None) -> None:
        """Write the row, or renew its lease, from ``lease_now`` (None: the database
        server's clock). An unanswered note is let go: the row's lease runs on."""
        await self._run(_NOTE, {"lease_now": lease_now})

    async def drop(self) -> None:
        """Delete the row: this worker waits no more. An unanswered deletion is let
        go: the row's lease runs out."""
        await self._run(_DROP, {})

    async def _run(self, statement: TextClause, extra: dict[str, object]) -> None:
        with contextlib.suppress(SQLAlchemyError, *LOCK_CONNECTION_ERRORS):
            async with asyncio.timeout(self.timeout), self.engine.begin() as conn:
                await conn.execute(statement, self._params | extra)
