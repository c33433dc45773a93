"""A drain pass writes its outcomes in batches, and a pass that dies before writing a
batch leaves those rows to come back when their lease runs out."""

import asyncio
import collections
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text

from app.db import Database
from app.outbox import Message, Outbox
from app.scheduler import FakeClock

from .conftest import MakeOutbox, SentStatements

_ROWS = 100


async def _enqueue(database: Database, outbox: Outbox, count: int) -> None:
    async with database.sessions() as session, session.begin():
        for n in range(count):
            await outbox.enqueue(session, {"n": n}, key=f"k{n}")


@pytest.mark.parametrize("outcome", ["succeeds", "fails"])
async def test_a_pass_writes_the_outcomes_of_many_rows_in_few_statements(
    make_outbox: MakeOutbox, database: Database, sent_statements: SentStatements, outcome: str
) -> None:
    async def receive(message: Message) -> None:
        if outcome == "fails":
            raise ConnectionError("receiver refused")

    outbox = make_outbox(deliver=receive, batch_size=50, concurrency=10)
    await _enqueue(database, outbox, _ROWS)
    sent_statements.texts.clear()
    report = await outbox.drain_once()
    assert report.delivered + report.retried == _ROWS
    # Claims and outcomes together: a handful per claimed batch, never one per row.
    assert len(sent_statements.writing()) <= _ROWS // 5


async def test_a_pass_killed_before_writing_its_outcomes_leaves_its_rows_to_the_lease(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock
) -> None:
    # The fifth delivery kills the pass's connection (the only other one: the pool's
    # connection is the pass's while it runs), then succeeds: its outcome, and
    # any other not yet written, can no longer be. The receiver dedupes on the
    # idempotency key, so what the next drain replays is covered.
    received: collections.Counter[str] = collections.Counter()
    kills: list[asyncio.Task[list[bool]]] = []

    async def kill_the_pass() -> list[bool]:
        async with database.engine.connect() as conn:
            killed = await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    " AND backend_type = 'client backend'"
                )
            )
            return list(killed.scalars())

    async def receive(message: Message) -> None:
        received[message.idempotency_key] += 1
        if sum(received.values()) == 5:
            # A task of its own: the pass may see its connection die and cancel this
            # delivery before the kill's own answer arrives.
            kills.append(asyncio.create_task(kill_the_pass()))
            await asyncio.shield(kills[0])

    outbox = make_outbox(deliver=receive, batch_size=20, concurrency=4, delivery_timeout=30)
    await _enqueue(database, outbox, 20)
    with pytest.raises(Exception) as raised:
        await outbox.drain_once()
    assert type(raised.value).__module__.startswith("asyncpg."), repr(raised.value)
    assert len(kills) == 1, repr(raised.value)
    assert await kills[0] == [True]
    first_pass = set(received)

    async with database.engine.connect() as conn:
        rows = (
            await conn.execute(text("SELECT key, status, next_attempt_at FROM outbox_messages"))
        ).all()
        written = {f"grants:{key}" for key, status, _ in rows if status == "delivered"}
        held = [due for _, status, due in rows if status == "pending"]
    assert written < first_pass
    assert all(due > clock.now() for due in held)
    assert (await outbox.drain_once()).delivered == 0

    clock.advance(timedelta(seconds=30 + 30 + 1))
    assert (await outbox.drain_once()).delivered == 20 - len(written)
    assert set(received) == {f"grants:k{n}" for n in range(20)}
    replayed = {key for key, count in received.items() if count > 1}
    assert replayed == first_pass - written
    assert max(received.values()) == 2


async def test_a_pass_claiming_a_large_batch_delivers_at_most_concurrency_rows_at_once(
    make_outbox: MakeOutbox, database: Database
) -> None:
    # The first deliveries wait until three are in flight, and then one more loop pass:
    # any delivery started beyond the bound would be in flight by then too.
    in_flight = 0
    peak = 0
    full = asyncio.Event()

    async def receive(message: Message) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == 3:
            asyncio.get_running_loop().call_soon(full.set)
        await full.wait()
        in_flight -= 1

    outbox = make_outbox(deliver=receive, batch_size=50, concurrency=3)
    await _enqueue(database, outbox, 20)
    assert (await outbox.drain_once()).delivered == 20
    assert peak == 3


async def test_a_delivery_that_begins_past_its_start_window_goes_out_only_under_a_fresh_claim(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock
) -> None:
    # The soak's double delivery: a delivery's task began after the pass made it, and the
    # world's time moved on in between (a loop busy or frozen that long): the row went out
    # after its lease had run out, while another drain claimed and delivered it too.
    began: list[tuple[str, datetime, datetime]] = []
    loop = asyncio.get_running_loop()

    async def receive(message: Message) -> None:
        async with database.engine.connect() as conn:
            lease_until = (
                await conn.execute(
                    text("SELECT next_attempt_at FROM outbox_messages WHERE id = :id"),
                    {"id": message.id},
                )
            ).scalar_one()
        began.append((message.key, clock.now(), lease_until))
        if message.key == "k0":
            # Queued so that it runs after the pass makes the next delivery's task and
            # before that task begins.
            loop.call_soon(loop.call_soon, clock.advance, 60)

    outbox = make_outbox(deliver=receive, batch_size=2, concurrency=1)
    await _enqueue(database, outbox, 2)
    report = await outbox.drain_once()

    assert report.delivered == 2
    assert [key for key, _, _ in began] == ["k0", "k1"]
    # Each began while its own claim's lease held: k1 was given back and claimed anew.
    assert all(at < lease_until for _, at, lease_until in began), began
