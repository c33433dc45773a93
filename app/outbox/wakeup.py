"""The NOTIFY wake-up: an enqueue's commit wakes the leader's drain at once.

Runs as a leader-only scheduler service: one LISTEN connection per outbox; a
notification naming the outbox triggers a drain, on that same connection: a pooled
connection would cost a checkout and its pre-ping (three round trips on asyncpg)
before the claim. Notifications that arrive while a
drain runs fold into one more drain after it, so a burst costs two drains, not one per
row. A dead connection raises, and the scheduler restarts the service with backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg

from .drain import prepare_connection
from .sql import NOTIFY_CHANNEL

__all__ = ["listen_and_drain"]


async def listen_and_drain(
    dsn: str, outbox: str, drain: Callable[[asyncpg.Connection], Awaitable[object]]
) -> None:
    """LISTEN for ``outbox``'s notifications and run ``drain(connection)`` on each, on
    the listening connection (asyncpg hands over a notification that arrives while a
    drain's statement runs, so none is lost); runs until cancelled.

    Raises ConnectionError when the listening connection dies.
    """
    connection = await asyncpg.connect(dsn)
    wake = asyncio.Event()
    lost = asyncio.Event()

    def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == outbox:
            wake.set()

    connection.add_termination_listener(lambda _conn: lost.set())
    try:
        await prepare_connection(connection)
        await connection.add_listener(NOTIFY_CHANNEL, on_notify)
        # Rows enqueued before we listened are picked up by this first drain.
        await drain(connection)
        while True:
            waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(lost.wait())]
            try:
                await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for waiter in waiters:
                    waiter.cancel()
            if lost.is_set():
                raise ConnectionError(f"the LISTEN connection of outbox {outbox!r} was lost")
            wake.clear()
            await drain(connection)
    finally:
        connection.terminate()
