"""What the lock connection reaches, and the checks that refuse a place a session lock
cannot live: a transaction-pooling proxy, a replica, another server or database than
the app's (the slot claims' fence looks for the key in the app's database)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from .errors import SchedulerError

__all__ = [
    "POOLER_SYMPTOMS",
    "DatabaseIdentity",
    "UnsafeLockConnectionError",
    "check_pooling",
    "check_primary",
    "check_same_database",
    "database_identity",
    "engine_identity",
]

_IDENTITY_SQL = "SELECT current_database(), pg_postmaster_start_time()"
_SYSTEM_IDENTIFIER_SQL = "SELECT system_identifier FROM pg_control_system()"


POOLER_SYMPTOMS = (
    asyncpg.exceptions.InvalidSQLStatementNameError,
    asyncpg.exceptions.DuplicatePreparedStatementError,
)


class UnsafeLockConnectionError(SchedulerError):
    """LOCK_DATABASE_URL reaches something a session lock cannot live on: a
    transaction-pooling proxy, a read-only replica, or another server or database than
    DATABASE_URL."""


@dataclass(frozen=True)
class DatabaseIdentity:
    """Which database of which running server a connection reached."""

    database: str
    server_started: datetime
    # None where the role may not call pg_control_system().
    system_identifier: int | None

    def same_as(self, other: DatabaseIdentity) -> bool:
        """True for the same database of the same running server.

        The start time of the server tells two running servers apart even where the
        role may not read the system identifier; the identifier, where both sides may
        read it, tells apart clusters that happen to share the start time.
        """
        if self.database != other.database or self.server_started != other.server_started:
            return False
        if self.system_identifier is None or other.system_identifier is None:
            return True
        return self.system_identifier == other.system_identifier

    def describe(self) -> str:
        """The database and its server, for an error message."""
        server = f"started {self.server_started.isoformat()}"
        if self.system_identifier is not None:
            server = f"system identifier {self.system_identifier}, {server}"
        return f'database "{self.database}" (server {server})'


async def database_identity(connection: asyncpg.Connection) -> DatabaseIdentity:
    database, started = await connection.fetchrow(_IDENTITY_SQL)
    try:
        system_identifier = await connection.fetchval(_SYSTEM_IDENTIFIER_SQL)
    except (asyncpg.InsufficientPrivilegeError, asyncpg.UndefinedFunctionError):
        # Some hosted servers revoke it; the start time still tells servers apart.
        system_identifier = None
    return DatabaseIdentity(database, started, system_identifier)


async def engine_identity(engine: AsyncEngine) -> DatabaseIdentity:
    """The database and server the app's engine reaches (DATABASE_URL).

    Raises ConnectionError when the app database cannot be asked now.
    """
    try:
        async with engine.connect() as conn:
            raw = await conn.get_raw_connection()
            # The driver's own connection: no transaction is open on it, so a refused
            # pg_control_system() leaves it usable.
            return await database_identity(raw.driver_connection)
    except DBAPIError as exc:
        raise ConnectionError(f"the app database did not answer: {exc}") from exc


def check_same_database(lock: DatabaseIdentity, app: DatabaseIdentity) -> None:
    """Raise UnsafeLockConnectionError when the lock connection and the app's engine
    reach different servers or databases."""
    if not lock.same_as(app):
        raise UnsafeLockConnectionError(
            f"LOCK_DATABASE_URL reaches {lock.describe()} but DATABASE_URL reaches "
            f"{app.describe()}; the slot claims look for the leader key in the app's "
            "database, so this leader would never fire; point LOCK_DATABASE_URL at the "
            "same server and database as DATABASE_URL (it may only bypass a pooling proxy)"
        )


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
