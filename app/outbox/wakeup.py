"""The wake-up: an enqueue's commit wakes the leader's drain at once, and the drain
wakes again when the earliest row not yet due falls due.

Runs as a leader-only scheduler service: one LISTEN connection per outbox; a
notification naming the outbox triggers a drain, on that same connection: a pooled
connection would cost a checkout and its pre-ping (three round trips on asyncpg)
before the claim. Notifications that arrive while a drain runs fold into one more
drain after it, so a burst costs two drains, not one per row.

After each drain it reads, in one probe of the due index, how long until the next
pending row falls due (a delayed message's moment, a retry, a claim's lease running
out), on the lease clock, and sleeps that long on the outbox's clock unless a
notification comes first: a delayed message is delivered within a round trip of its
moment, and nothing polls, whatever the number of rows. A row that fell due since the
previous probe (its moment came while the drain ran, after its last claim) is due at
once: the probe counts from the previous probe's now, read before that drain began.
An enqueue of an earlier moment notifies, so the sleep is cut short and measured
again. A dead connection raises, and the scheduler restarts the service with backoff.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime

import asyncpg
from sqlalchemy import text

from app.scheduler import Clock
from app.scheduler.clock import LEASE_NOW_SQL, lease_now
from app.scheduler.loop import run_loop

from .connection import fetch, prepare_connection
from .sql import NEXT_DUE, NOTIFY_CHANNEL

__all__ = ["listen_and_drain", "seconds_until_due"]

_LEASE_CLOCK_NOW = text(f"SELECT {LEASE_NOW_SQL}")


async def seconds_until_due(
    connection: asyncpg.Connection, outbox: str, clock: Clock, since: datetime
) -> tuple[float | None, datetime]:
    """Seconds until ``outbox``'s earliest pending row that falls due after ``since``
    (a reading of the lease clock of ``clock``) falls due, 0 when it already has, None
    when there is none; and the lease clock's now, read by the same statement (the
    ``since`` of the next call)."""
    params = {"outbox": outbox, "since": since, "lease_now": lease_now(clock)}
    [row] = await fetch(connection, NEXT_DUE, params)
    return row["seconds"], row["now"]


async def listen_and_drain(
    dsn: str,
    outbox: str,
    drain: Callable[[asyncpg.Connection], Awaitable[object]],
    clock: Clock,
) -> None:
    """LISTEN for ``outbox``'s notifications and run ``drain(connection)`` on each, on
    the listening connection (asyncpg hands over a notification that arrives while a
    drain's statement runs, so none is lost), and once the earliest pending row falls
    due, waiting on ``clock``; runs until cancelled.

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

        # One drain (the first picks up rows enqueued before we listened), then wait
        # for a NOTIFY or the earliest row's moment (none pending: a NOTIFY only).
        # ``since``: the lease clock's now before the drain that just ran.
        [[since]] = await fetch(connection, _LEASE_CLOCK_NOW, {"lease_now": lease_now(clock)})

        async def step() -> float | None:
            nonlocal since
            if lost.is_set():
                raise ConnectionError(f"the LISTEN connection of outbox {outbox!r} was lost")
            wake.clear()
            await drain(connection)
            seconds, since = await seconds_until_due(connection, outbox, clock, since)
            return seconds

        await run_loop(step, clock, wakes=[wake.wait, lost.wait])
    finally:
        connection.terminate()
