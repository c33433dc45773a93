"""Faults a test can cause on purpose: the leader's lock connection cut from outside.

Restarting or crashing the server is ``TestServer.restart()`` / ``crash()`` / ``start()``
(only on the throwaway server the kit started).
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.keys import DEFAULT_SCHEDULE, LEADER_KEY_LOCKS_BOUND, LeaderKey

__all__ = ["terminate_leader_connection"]

_TERMINATE_HOLDERS = text(
    f"SELECT pg_terminate_backend(pid) FROM pg_locks WHERE {LEADER_KEY_LOCKS_BOUND} AND granted"
)


async def terminate_leader_connection(
    engine: AsyncEngine, *, schedule: str = DEFAULT_SCHEDULE
) -> int:
    """``pg_terminate_backend`` the connection that holds the leader key of the schedule
    named ``schedule`` in ``engine``'s database, as an operator or a server-side timeout
    would; returns how many were terminated (0 when nobody leads). The leader demotes;
    a standby takes over."""
    async with engine.connect() as conn:
        result = await conn.execute(_TERMINATE_HOLDERS, LeaderKey.of(schedule).bind_params)
        return len(result.all())
