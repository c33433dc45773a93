"""A connection its server ended between two statements is a passing outage.

A server that terminates a backend (pg_terminate_backend, a restart, an idle timeout)
sends FATAL and closes the socket. When the client is between statements, asyncpg
reads the FATAL as a protocol error and the close only on a later turn of the loop: a
statement begun in between raises InternalClientError ("cannot switch to state 12;
another operation (2) is in progress"), not a connection error. Seen in the soak as
LockConnection.connect's third statement during a server restart: the supervisor
crashed and restarted 5 s later (scheduler.crashed) where the same restart, met
mid-statement, backs off (scheduler.lock_unreachable).
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

from app.db import asyncpg_dsn
from app.scheduler.faults import UNREACHABLE


async def _statement_after_the_server_ended_it(dsn: str) -> BaseException:
    """Run a statement on a connection whose FATAL the client has read and whose close
    it has not; return what the statement raised."""
    connection = await asyncpg.connect(dsn)
    try:
        pid = await connection.fetchval("SELECT pg_backend_pid()")
        # The socket is not read while the server ends the backend: the FATAL and the
        # close then wait for the loop together, and it takes them on separate turns.
        # (asyncpg has no public handle on its transport; this is the asyncio one.)
        connection._transport.pause_reading()
        other = await asyncpg.connect(dsn)
        try:
            await other.execute("SELECT pg_terminate_backend($1)", pid)
            gone = "SELECT count(*) FROM pg_stat_activity WHERE pid = $1"
            deadline = time.monotonic() + 10
            while await other.fetchval(gone, pid):
                assert time.monotonic() < deadline, "the backend was never terminated"
                await asyncio.sleep(0.02)
        finally:
            await other.close()
        connection._transport.resume_reading()
        # One turn reads the FATAL, the next would read the close: begin in between.
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        try:
            await connection.fetchval("SELECT pg_backend_pid()")
        except BaseException as exc:
            return exc
        raise AssertionError("a statement ran on a terminated backend")
    finally:
        connection.terminate()


def test_a_statement_on_a_connection_ended_between_statements_counts_as_unreachable(
    database_url: str,
) -> None:
    raised = asyncio.run(_statement_after_the_server_ended_it(asyncpg_dsn(database_url)))
    assert isinstance(raised, UNREACHABLE), repr(raised)
