"""An inline attempt (Outbox.attempt, a route's BackgroundTasks) keeps the drain's start
window: its delivery begins only while its claim's lease still covers the whole
delivery, so a row is never delivered by it and by a drain at once."""

from __future__ import annotations

import asyncio
from datetime import datetime

from sqlalchemy import text

from app.db import Database
from app.outbox import Message
from app.scheduler import FakeClock

from ..conftest import statement_waits_on_a_lock
from .conftest import FakeReceiver, MakeOutbox, enqueue


async def test_an_inline_attempt_that_begins_past_its_start_window_delivers_nothing_beside_a_drain(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock, receiver: FakeReceiver
) -> None:
    # The attempt's claim is answered late (here: it waited on a lock while the world's
    # time moved on; in production, a loop busy or frozen between the claim and the
    # delivery): its delivery would begin after the lease the claim took had run out,
    # while another drain claims and delivers the row. The drain gives such a row back
    # (its start window, checked as the delivery begins); the attempt must too.
    began: list[tuple[str, datetime, datetime]] = []
    drain = make_outbox(deliver=receiver)

    async def receive(message: Message) -> None:
        async with database.engine.connect() as conn:
            lease_until = (
                await conn.execute(
                    text("SELECT next_attempt_at FROM outbox_messages WHERE id = :id"),
                    {"id": message.id},
                )
            ).scalar_one()
        began.append((message.key, clock.now(), lease_until))
        # Another worker's drain runs while the attempt delivers.
        await drain.drain_once()
        await receiver(message)

    outbox = make_outbox(deliver=receive)
    [row] = await enqueue(database, outbox, "k1")
    async with database.engine.connect() as blocker:
        await blocker.execute(text("LOCK TABLE outbox_messages IN SHARE MODE"))
        attempt = asyncio.create_task(outbox.attempt(row))
        deadline = asyncio.get_running_loop().time() + 10
        while not await statement_waits_on_a_lock(database.engine, "UPDATE outbox_messages"):
            assert asyncio.get_running_loop().time() < deadline, "the claim never waited"
            await asyncio.sleep(0.05)
        clock.advance(outbox.delivery_timeout + 31)
        await blocker.rollback()
    await asyncio.wait_for(attempt, 10)

    assert all(at < lease_until for _, at, lease_until in began), (began, receiver.delivered)
    assert receiver.delivered["k1"] == 1, dict(receiver.delivered)
