"""Outbox fixtures: a fake receiver, the FakeClock, outboxes bound to the test database."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event

from app.db import Database, asyncpg_dsn
from app.outbox import DrainReport, Message, Outbox
from app.outbox.connection import prepare_connection
from app.scheduler import Clock, FakeClock, SystemClock

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


@dataclass
class HeldReceiver:
    """A receiver whose every call waits until the test sets ``release``: a delivery
    under way. ``entered`` is set once a call waits."""

    calls: list[Message] = field(default_factory=list)
    entered: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def __call__(self, message: Message) -> None:
        self.calls.append(message)
        self.entered.set()
        await self.release.wait()


MakeOutbox = Callable[..., Outbox]


async def enqueue(database: Database, outbox: Outbox, *keys: str) -> list[int]:
    """Enqueue one row per key (payload ``{"key": key}``) in one committed transaction;
    their ids."""
    async with database.sessions() as session, session.begin():
        return [(await outbox.enqueue(session, {"key": key}, key=key)).id for key in keys]


@dataclass
class SentStatements:
    """Every statement the test database's pooled connections sent, in order."""

    texts: list[str] = field(default_factory=list)

    def writing(self, table: str = "outbox_messages") -> list[str]:
        """The UPDATEs of ``table``: claims and outcomes."""
        return [sql for sql in self.texts if sql.lstrip().startswith(f"UPDATE {table}")]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def receiver() -> FakeReceiver:
    return FakeReceiver()


@pytest.fixture
def held_receiver() -> HeldReceiver:
    return HeldReceiver()


@pytest.fixture
def make_outbox(
    database: Database, database_url: str, clock: FakeClock, receiver: FakeReceiver
) -> Iterator[MakeOutbox]:
    """Build an outbox bound to the test database and the FakeClock, or to
    ``host_clock``: the clock of the process the outbox stands in."""

    def make(
        name: str = "grants",
        deliver: Any = None,
        *,
        host_clock: Clock | None = None,
        **options: Any,
    ) -> Outbox:
        outbox = Outbox(name, deliver or receiver, **options)
        outbox.bind(
            database.engine, listen_dsn=asyncpg_dsn(database_url), clock=host_clock or clock
        )
        return outbox

    yield make


@pytest.fixture
def sent_statements(database: Database) -> Iterator[SentStatements]:
    """Record what the pool's asyncpg connections send (asyncpg's query logger, attached
    at checkout), so a test can count the statements a drain pass costs."""
    sent = SentStatements()

    def log(query: Any) -> None:
        sent.texts.append(query.query)

    def attach(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(log)

    def detach(dbapi_connection: Any, record: Any) -> None:
        if dbapi_connection is not None:  # None once a dead connection was invalidated
            dbapi_connection.driver_connection.remove_query_logger(log)

    pool = database.engine.sync_engine.pool
    event.listen(pool, "checkout", attach)
    event.listen(pool, "checkin", detach)
    try:
        yield sent
    finally:
        event.remove(pool, "checkout", attach)
        event.remove(pool, "checkin", detach)


@dataclass
class Delivering:
    """Row ``row``, which a drain on a host with a true clock is delivering: its
    receiver has the call and has not answered."""

    row: int
    receiver: HeldReceiver
    drain: asyncio.Task[DrainReport]

    async def finish(self) -> DrainReport:
        """Let the receiver answer; the drain's report."""
        self.receiver.release.set()
        return await self.drain


@pytest.fixture
async def delivering(
    make_outbox: MakeOutbox, database: Database, held_receiver: HeldReceiver
) -> AsyncIterator[Delivering]:
    """A row a drain on a host whose clock is the database's is delivering, with the
    outbox's default lease (delivery_timeout 30 s and the 30 s margin)."""
    outbox = make_outbox(deliver=held_receiver, host_clock=SystemClock())
    [row] = await enqueue(database, outbox, "k1")
    drain = asyncio.create_task(outbox.drain_once())
    async with asyncio.timeout(10):
        await held_receiver.entered.wait()
    under_way = Delivering(row, held_receiver, drain)
    try:
        yield under_way
    finally:
        await under_way.finish()


@pytest.fixture
async def drain_connection(database_url: str) -> AsyncIterator[Any]:
    """A plain asyncpg connection made ready for drain passes (Outbox.drain_on), as the
    wake-up's: a test can ask its backend what it did."""
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await prepare_connection(connection)
        yield connection
    finally:
        await connection.close()
