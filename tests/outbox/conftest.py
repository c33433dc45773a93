"""Outbox fixtures: a fake receiver, the FakeClock, outboxes bound to the test database."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest

from app.db import Database, asyncpg_dsn
from app.outbox import Message, Outbox
from app.scheduler import FakeClock

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass
class FakeReceiver:
    """Stands in for the remote system. ``behaviour(message)`` raises to fail a call."""

    behaviour: Callable[[Message], None] = lambda message: None
    calls: list[Message] = field(default_factory=list)
    delivered: collections.Counter[str] = field(default_factory=collections.Counter)
    called: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: Message) -> None:
        self.calls.append(message)
        self.called.set()
        self.behaviour(message)
        self.delivered[message.key] += 1


MakeOutbox = Callable[..., Outbox]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def receiver() -> FakeReceiver:
    return FakeReceiver()


@pytest.fixture
def make_outbox(
    database: Database, database_url: str, clock: FakeClock, receiver: FakeReceiver
) -> Iterator[MakeOutbox]:
    """Build an outbox bound to the test database and the FakeClock."""

    def make(name: str = "grants", deliver: Any = None, **options: Any) -> Outbox:
        outbox = Outbox(name, deliver or receiver, **options)
        outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database_url), clock=clock)
        return outbox

    yield make
