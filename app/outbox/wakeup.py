"""The NOTIFY wake-up: an enqueue's commit wakes the leader's drain at once.

Runs as a leader-only scheduler service: one LISTEN connection per outbox; a
notification naming the outbox triggers a drain. Notifications that arrive while a
drain runs fold into one more drain after it, so a burst costs two drains, not one per
row. A dead connection raises, and the scheduler restarts the service with backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg

from .sql import NOTIFY_CHANNEL

__all__ = ["listen_and_drain"]


async def listen_and_drain(dsn: str, outbox: str, drain: Callable[[], Awaitable[object]]) -> None:
    """LISTEN for ``outbox``'s notifications and drain on each; runs until cancelled.

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
        await connection.add_listener(NOTIFY_CHANNEL, on_notify)
        # Rows enqueued before we listened are picked up by this first drain.
        await drain()
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
            await drain()
    finally:
        connection.terminate()
