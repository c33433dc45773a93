"""Outbox helpers for tests: a receiver that records deliveries, and one drain pass."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from app.db import Database, asyncpg_dsn
from app.outbox import DrainReport, Message, Outbox
from app.scheduler import Clock

__all__ = ["RecordingReceiver", "drain"]


@dataclass
class RecordingReceiver:
    """A fake remote system for an Outbox's ``deliver``: records every call.

    ``behaviour(message)`` runs on each call; make it raise to fail that delivery
    (PermanentDeliveryError makes the row stuck). ``delivered`` counts the successful
    deliveries per idempotency key: a key above 1 is a double delivery.
    """

    behaviour: Callable[[Message], None] = lambda message: None
    calls: list[Message] = field(default_factory=list)
    delivered: collections.Counter[str] = field(default_factory=collections.Counter)
    called: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: Message) -> None:
        """Record the call, run ``behaviour``, count the key as delivered."""
        self.calls.append(message)
        self.called.set()
        self.behaviour(message)
        self.delivered[message.key] += 1


async def drain(
    outbox: Outbox, *, database: Database | None = None, clock: Clock | None = None
) -> DrainReport:
    """Run one drain pass of ``outbox`` (binding it to ``database`` first, when given)
    and return its report: delivered, retried and stuck counts. Due times are read on
    the outbox's lease clock: under a FakeClock, a delayed message (``at=``,
    ``delay=``) is delivered only by a pass after the test has moved the clock past
    its moment."""
    if database is not None:
        outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database.url), clock=clock)
    return await outbox.drain_once()
