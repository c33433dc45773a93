"""The lock connection: the one asyncpg connection through which a worker leads.

It is dedicated (never from the pool, never through a transaction-pooling proxy),
names its process in ``application_name`` before it takes the lock, never opens a
transaction (so it sits "idle", not "idle in transaction"; its one write, the
promotion's record that moves the leadership term, is a single statement), and carries
``idle_session_timeout`` = the lease: a leader that stops talking to the server for a
lease (hung loop, SIGSTOP, partition) is disconnected by the server, which releases
the key for a standby. So a leader talks to the server at least every
LEADER_TICK_SECONDS through every wait, the handover and shutdown graces included.

A standby's backend waits inside ``pg_advisory_lock`` and reads nothing from its
client, so a standby that died (kill -9, Ctrl-C of its uvicorn) would stay queued for
the key, in CLOSE-WAIT, until the next handover, and be counted as a standby. The
session therefore sets ``client_connection_check_interval`` (the server polls the
socket during the wait and ends the backend once the client has closed it) and
``tcp_keepalives_*`` (probes find a client whose host vanished without a FIN); the
client socket probes the server the same way, so a standby whose server vanished
stops waiting. A dead standby leaves the queue within CLIENT_CHECK_SECONDS, one
whose host vanished within KEEPALIVE_SECONDS.

Its startup packet also sets ``lock_timeout`` and ``statement_timeout`` to 0 (and
``transaction_timeout`` where the server has it): a standby waits inside
``pg_advisory_lock`` for as long as the leader leads, and a timeout set on the role
or database would cut that wait. Startup settings override role and database
defaults.

At connect it refuses (UnsafeLockConnectionError) a transaction-pooling proxy, a
replica, and a server or database other than the app's: the slot claims' fence looks
for the key in the app's database, so a key held anywhere else would make a leader
that never fires.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Sequence
from datetime import datetime

import asyncpg

from .clock import lease_now_sql
from .faults import LOCK_CONNECTION_ERRORS
from .keys import DEFAULT_SCHEDULE, WAKE_CHANNEL, LeaderKey
from .lock_target import (
    POOLER_SYMPTOMS,
    DatabaseIdentity,
    UnsafeLockConnectionError,
    check_pooling,
    check_primary,
    check_same_database,
    database_identity,
)

__all__ = [
    "CLIENT_CHECK_SECONDS",
    "KEEPALIVE_SECONDS",
    "WAKE_CHANNEL",
    "LockConnection",
    "application_name",
]


logger = logging.getLogger("app.scheduler")


def _ownership_sql(key: LeaderKey) -> str:
    """The seed's ownership query, on the shared pg_locks predicate of ``key``."""
    return f"SELECT count(*) FROM pg_locks WHERE {key.locks} AND granted AND pid = pg_backend_pid()"


# A standby's wait lasts as long as the leader leads: no timeout may cut it.
_NO_TIMEOUTS = {"lock_timeout": "0", "statement_timeout": "0"}
# transaction_timeout (PostgreSQL 17) also bounds a single statement; older servers
# refuse the name in a startup packet, so it is set only where it exists.
_NO_TRANSACTION_TIMEOUT = (
    "SELECT set_config('transaction_timeout', '0', false)"
    " WHERE current_setting('transaction_timeout', true) IS NOT NULL"
)
# The promotion's record waits for fenced transactions while the old leader's heartbeat
# may rewrite the row; under a repeatable-read default it would then fail to serialize
# instead of moving on. Set after connect, not in the startup packet: a session pooler
# refuses startup parameters it was not told to ignore.
_READ_COMMITTED = "SET default_transaction_isolation = 'read committed'"

# How often the server checks that a waiting client is still connected.
CLIENT_CHECK_SECONDS = 1
# Keepalive probes on both ends: the first after _KEEPALIVE_IDLE silent seconds, then
# every _KEEPALIVE_INTERVAL; _KEEPALIVE_COUNT unanswered ones end the connection.
_KEEPALIVE_IDLE = 5
_KEEPALIVE_INTERVAL = 1
_KEEPALIVE_COUNT = 3
KEEPALIVE_SECONDS = _KEEPALIVE_IDLE + _KEEPALIVE_INTERVAL * _KEEPALIVE_COUNT
# Set after connect, not in the startup packet: a session-pooling proxy in front of
# the server refuses startup parameters it does not know. client_connection_check_
# interval (PostgreSQL 14) is set only where it exists.
_LIVENESS = (
    "SELECT set_config('tcp_keepalives_idle', $1, false),"
    " set_config('tcp_keepalives_interval', $2, false),"
    " set_config('tcp_keepalives_count', $3, false),"
    " (SELECT set_config('client_connection_check_interval', $4, false)"
    "  WHERE current_setting('client_connection_check_interval', true) IS NOT NULL)"
)


def _record_leadership_sql(key: LeaderKey) -> str:
    """Who leads, for operators, the jobs it fires and the services it runs, for its
    standbys, and the leadership
    term, for the jobs' fence: one statement on the schedule's row, matching only while
    this connection holds the schedule's key. It locks the row FOR UPDATE first, which
    waits for every transaction that holds it FOR KEY SHARE (ctx.fence), so the new term
    begins after the fenced commits under way; the upsert's own row lock would not (it
    changes no key column). The term starts at 1 on the first promotion. The first heartbeat
    is on the lease clock ($7; NULL for the database server's), as every later one is."""
    return f"""
    WITH fenced_commits_done AS (
        SELECT 1 FROM scheduler_leadership WHERE schedule = $1 FOR UPDATE
    )
    INSERT INTO scheduler_leadership AS led
        (schedule, pid, host, backend_pid, since, heartbeat_at, term, job_ids, service_ids)
    SELECT $1, $2, $3, pg_backend_pid(), $4, {lease_now_sql("$7")}, 1, $5, $6
    WHERE EXISTS (
        SELECT 1 FROM pg_locks WHERE {key.locks} AND granted AND pid = pg_backend_pid())
        -- Read, so that the lock is taken (an unread CTE never runs), before the upsert.
        -- It also makes the bump an exclusive update: a repeatable-read fence whose
        -- snapshot predates it fails to serialize instead of locking the old term.
        AND (SELECT count(*) FROM fenced_commits_done) >= 0
    ON CONFLICT (schedule) DO UPDATE SET pid = excluded.pid, host = excluded.host,
        backend_pid = excluded.backend_pid, since = excluded.since,
        heartbeat_at = excluded.heartbeat_at, term = led.term + 1, job_ids = excluded.job_ids,
        service_ids = excluded.service_ids
    RETURNING term
    """


# True only when a leadership of the schedule was recorded and its backend is no longer
# among the server's backends: that leader can fire nothing more. No record, or a
# backend still listed, is not proof. Our own backend carrying the recorded pid (reused)
# proves the recorded one gone: this connection has recorded nothing yet.
_PREVIOUS_LEADER_GONE = """
    SELECT EXISTS (
        SELECT 1 FROM scheduler_leadership led
        WHERE led.schedule = $1 AND NOT EXISTS (
            SELECT 1 FROM pg_stat_activity a
            WHERE a.pid = led.backend_pid AND a.pid <> pg_backend_pid()))
    """


def application_name(pid: int) -> str:
    """What the lock connection of process ``pid`` is called on the server."""
    return f"scheduler-leader:{pid}"


def _probe_server(connection: asyncpg.Connection) -> None:
    """Turn on TCP keepalives on the client socket (asyncpg has no option for them)."""
    # The driver keeps its transport private; the socket is the only way in.
    sock = connection._transport.get_extra_info("socket")
    if sock is None or sock.family == socket.AF_UNIX:
        # A Unix socket has no peer host that could vanish.
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # Linux names; other systems keep their defaults (probes still on).
    for name, value in (
        ("TCP_KEEPIDLE", _KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", _KEEPALIVE_COUNT),
    ):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class LockConnection:
    """A dedicated connection that can hold the scheduler's session advisory lock."""

    def __init__(
        self,
        connection: asyncpg.Connection,
        backend_pid: int,
        identity: DatabaseIdentity | None = None,
        key: LeaderKey | None = None,
    ) -> None:
        self._connection = connection
        self._closing = False
        self.backend_pid = backend_pid
        self.identity = identity
        self.key = key or LeaderKey.of(DEFAULT_SCHEDULE)

    @classmethod
    async def connect(
        cls,
        dsn: str,
        *,
        lease_seconds: int,
        timeout: float = 10,
        schedule: str = DEFAULT_SCHEDULE,
    ) -> LockConnection:
        """Open the connection with the lease, no statement or lock timeout, the
        holder's name set at connect, keepalives on both ends and the server's client
        check.

        Raises OSError, asyncpg errors or TimeoutError when the server cannot be reached,
        and UnsafeLockConnectionError behind a transaction-pooling proxy or on a replica.
        The connection leads the schedule named ``schedule`` (its key: keys.LeaderKey).
        """
        key = LeaderKey.of(schedule)
        connection = await asyncpg.connect(
            dsn,
            timeout=timeout,
            server_settings={
                "application_name": application_name(os.getpid()),
                "idle_session_timeout": str(lease_seconds * 1000),
                # Never bites: the lock connection opens no transaction. It overrides a
                # shorter role default all the same, and equals the lease should one
                # ever be left open.
                "idle_in_transaction_session_timeout": str(lease_seconds * 1000),
                **_NO_TIMEOUTS,
            },
        )
        try:
            _probe_server(connection)
            backend_pid = await connection.fetchval("SELECT pg_backend_pid()")
            check_pooling(backend_pid, await connection.fetchval("SELECT pg_backend_pid()"))
            check_primary(await connection.fetchval("SELECT pg_is_in_recovery()"))
            await connection.execute(_NO_TRANSACTION_TIMEOUT)
            await connection.execute(_READ_COMMITTED)
            await connection.execute(
                _LIVENESS,
                str(_KEEPALIVE_IDLE),
                str(_KEEPALIVE_INTERVAL),
                str(_KEEPALIVE_COUNT),
                str(CLIENT_CHECK_SECONDS * 1000),
            )
            identity = await database_identity(connection)
        except POOLER_SYMPTOMS as exc:
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
        return cls(connection, backend_pid, identity, key)

    async def check_same_database(self, app: DatabaseIdentity) -> None:
        """Raise UnsafeLockConnectionError unless this connection reached the app's
        database on the app's server (``app``, read after this connection opened).

        A server restart between the two reads would make a healthy set-up look wrong;
        it also killed this connection, so a mismatch is reported only after this
        connection proves alive (else asyncpg's connection error is raised: retry).
        """
        assert self.identity is not None, "identity is read by connect()"
        if not self.identity.same_as(app):
            await self._connection.fetchval("SELECT 1")
        check_same_database(self.identity, app)

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
        acquired = await self._connection.fetchval(
            self.key.call("pg_try_advisory_lock"), *self.key.args
        )
        return acquired is True

    async def wait_acquire(self) -> None:
        """Block until the key is ours. The server wakes us the moment it is released."""
        await self._connection.execute(self.key.call("pg_advisory_lock"), *self.key.args)

    async def record_leadership(
        self,
        *,
        pid: int,
        host: str,
        since: datetime,
        job_ids: Sequence[str] = (),
        service_ids: Sequence[str] = (),
        heartbeat_at: datetime | None = None,
    ) -> int | None:
        """Begin a leadership term of this schedule: record who leads, the ids of the
        leader-only jobs it fires and of the services it runs, and move the term, on
        this connection, while it holds the key. Returns the new term, or None when
        this connection does not hold the key (nothing is written).

        The first heartbeat is ``heartbeat_at`` on a test's lease clock, else the
        database server's clock (never the host's: health ages it on that clock).

        Waits for every job transaction that took the term FOR KEY SHARE (``ctx.fence``) to
        end (the caller ends those that take too long: end_old_term_transactions). While
        it waits the connection runs a statement, so ``idle_session_timeout`` does not cut
        it, and a connection that dies makes it raise.
        """
        term: int | None = await self._connection.fetchval(
            _record_leadership_sql(self.key),
            self.key.schedule,
            pid,
            host,
            since,
            sorted(job_ids),
            sorted(service_ids),
            heartbeat_at,
        )
        return term

    async def previous_leader_gone(self, timeout: float) -> bool:
        """True when the last recorded leadership's backend has left the server (its
        process killed, its connection terminated or timed out), so that leader can
        neither claim a slot nor pass a fence any more.

        False when no leadership was recorded, when that backend is still listed in
        pg_stat_activity (a graceful handover, or one still exiting), and on an error
        or no answer within ``timeout``: in doubt, the handover grace applies.
        """
        try:
            async with asyncio.timeout(timeout):
                gone = await self._connection.fetchval(_PREVIOUS_LEADER_GONE, self.key.schedule)
        except LOCK_CONNECTION_ERRORS:
            return False
        return gone is True

    async def holds_lock(self, timeout: float) -> bool:
        """True when this connection still holds the key, checked on the server.

        A dead connection or no answer within ``timeout`` counts as False: in doubt,
        the leader stops firing.
        """
        try:
            async with asyncio.timeout(timeout):
                count = await self._connection.fetchval(_ownership_sql(self.key))
        except LOCK_CONNECTION_ERRORS:
            return False
        return bool(count == 1)

    async def release(self, timeout: float = 5) -> None:
        """Unlock and close; a dead connection is just closed (closing releases anyway)."""
        self._closing = True
        try:
            async with asyncio.timeout(timeout):
                await self._connection.execute(self.key.call("pg_advisory_unlock"), *self.key.args)
                await self._connection.close(timeout=timeout)
        except LOCK_CONNECTION_ERRORS:
            logger.debug("lock connection unlock failed; terminating it", exc_info=True)
        finally:
            self.close()

    def close(self) -> None:
        """Drop the connection at once; the server releases the key with it."""
        self._closing = True
        if not self._connection.is_closed():
            self._connection.terminate()
