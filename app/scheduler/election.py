"""The lock connection: the one asyncpg connection through which a worker leads.

It is dedicated (never from the pool, never through a transaction-pooling proxy),
names its process in ``application_name`` before it takes the lock, never opens a
transaction (so it sits "idle", not "idle in transaction"), and carries
``idle_session_timeout`` = the lease: a leader that stops talking to the server for a
lease (hung loop, SIGSTOP, partition) is disconnected by the server, which releases
the key for a standby.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

import asyncpg

from .errors import SchedulerError
from .keys import SCHEDULER_LEADER_KEY

__all__ = [
    "OWNERSHIP_SQL",
    "WAKE_CHANNEL",
    "LockConnection",
    "UnsafeLockConnectionError",
    "check_pooling",
    "check_primary",
]

# NOTIFY on this channel makes the leader reload its job rows now (pause, run now).
WAKE_CHANNEL = "regent_scheduler"

logger = logging.getLogger("app.scheduler")

# The seed's ownership query. pg_locks is cluster-wide and an advisory key is per
# database, so the database predicate is always there.
OWNERSHIP_SQL = """
    SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND objid = $1 AND granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND pid = pg_backend_pid()
"""


_POOLER_SYMPTOMS = (
    asyncpg.exceptions.InvalidSQLStatementNameError,
    asyncpg.exceptions.DuplicatePreparedStatementError,
)


class UnsafeLockConnectionError(SchedulerError):
    """LOCK_DATABASE_URL reaches something a session lock cannot live on: a
    transaction-pooling proxy or a read-only replica."""


def check_pooling(first_pid: int, second_pid: int) -> None:
    """Raise UnsafeLockConnectionError when two statements ran on different backends."""
    if first_pid != second_pid:
        raise UnsafeLockConnectionError(
            "LOCK_DATABASE_URL goes through a transaction-pooling proxy: pg_backend_pid() "
            f"changed between two statements ({first_pid}, then {second_pid}), so a session "
            "advisory lock would be lost; point LOCK_DATABASE_URL at PostgreSQL directly"
        )


def check_primary(in_recovery: bool) -> None:
    """Raise UnsafeLockConnectionError on a replica, where no lock coordinates writers."""
    if in_recovery:
        raise UnsafeLockConnectionError(
            "LOCK_DATABASE_URL reaches a read-only replica (pg_is_in_recovery() is true); "
            "point LOCK_DATABASE_URL at the primary"
        )


class LockConnection:
    """A dedicated connection that can hold the scheduler's session advisory lock."""

    def __init__(self, connection: asyncpg.Connection, backend_pid: int) -> None:
        self._connection = connection
        self._closing = False
        self.backend_pid = backend_pid
        self.key = SCHEDULER_LEADER_KEY

    @classmethod
    async def connect(cls, dsn: str, *, lease_seconds: int, timeout: float = 10) -> LockConnection:
        """Open the connection with the lease and the holder's name set at connect.

        Raises OSError, asyncpg errors or TimeoutError when the server cannot be reached,
        and UnsafeLockConnectionError behind a transaction-pooling proxy or on a replica.
        """
        connection = await asyncpg.connect(
            dsn,
            timeout=timeout,
            server_settings={
                "application_name": f"scheduler-leader:{os.getpid()}",
                "idle_session_timeout": str(lease_seconds * 1000),
                "idle_in_transaction_session_timeout": str(lease_seconds * 1000),
            },
        )
        try:
            backend_pid = await connection.fetchval("SELECT pg_backend_pid()")
            check_pooling(backend_pid, await connection.fetchval("SELECT pg_backend_pid()"))
            check_primary(await connection.fetchval("SELECT pg_is_in_recovery()"))
        except _POOLER_SYMPTOMS as exc:
            # A statement prepared on one backend and run on another: a pooler.
            connection.terminate()
            raise UnsafeLockConnectionError(
                "LOCK_DATABASE_URL goes through a transaction-pooling proxy (a prepared "
                f"statement vanished between two round trips: {exc}); a session advisory "
                "lock would be lost; point LOCK_DATABASE_URL at PostgreSQL directly"
            ) from exc
        except BaseException:
            connection.terminate()
            raise
        return cls(connection, backend_pid)

    async def on_wake(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on every NOTIFY to WAKE_CHANNEL (LISTEN opens no transaction)."""
        await self._connection.add_listener(WAKE_CHANNEL, lambda *_args: callback())

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` as soon as the connection dies (terminated, server gone);
        not when we close it ourselves."""

        def listener(_connection: object) -> None:
            if not self._closing:
                callback()

        self._connection.add_termination_listener(listener)

    async def try_acquire(self) -> bool:
        """One non-blocking attempt at the key."""
        acquired = await self._connection.fetchval("SELECT pg_try_advisory_lock($1)", self.key)
        return acquired is True

    async def wait_acquire(self) -> None:
        """Block until the key is ours. The server wakes us the moment it is released."""
        await self._connection.execute("SELECT pg_advisory_lock($1)", self.key)

    async def holds_lock(self, timeout: float) -> bool:
        """True when this connection still holds the key, checked on the server.

        A dead connection or no answer within ``timeout`` counts as False: in doubt,
        the leader stops firing.
        """
        try:
            async with asyncio.timeout(timeout):
                count = await self._connection.fetchval(OWNERSHIP_SQL, self.key)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            return False
        return bool(count == 1)

    async def release(self, timeout: float = 5) -> None:
        """Unlock and close; a dead connection is just closed (closing releases anyway)."""
        self._closing = True
        try:
            async with asyncio.timeout(timeout):
                await self._connection.execute("SELECT pg_advisory_unlock($1)", self.key)
                await self._connection.close(timeout=timeout)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError):
            logger.debug("lock connection unlock failed; terminating it", exc_info=True)
        finally:
            self.close()

    def close(self) -> None:
        """Drop the connection at once; the server releases the key with it."""
        self._closing = True
        if not self._connection.is_closed():
            self._connection.terminate()
