"""A drain whose host clock is stepped (NTP) in the middle of a pass keeps its start
window: a row starts only within the window after its claim, as the database's clock
measures it, so its delivery ends before its lease runs out and no other drain delivers
it at the same time."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import text

from app.db import Database
from app.outbox import Message
from app.scheduler import SystemClock

from ..conftest import SkewedClock
from .conftest import FakeReceiver, MakeOutbox, enqueue

_TIMEOUT = 5.0
# The drain's margin over the delivery timeout, and the half of it a row may start in.
_LEASE = _TIMEOUT + 30
_START_WINDOW = 15.0
# Each delivery takes most of the delivery timeout, one at a time: the eighth delivery
# of a batch begins 7 x 4.8 = 33.6 s into the pass, past its window and 1.4 s before its
# lease runs out.
_EACH = 4.8
_KEYS = [f"k{n}" for n in range(1, 9)]


async def _lease_left(database: Database, row: int) -> float:
    """Seconds until the row's lease runs out, on the database's clock."""
    async with database.engine.connect() as conn:
        left = await conn.execute(
            text(
                "SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float"
                " FROM outbox_messages WHERE id = :id"
            ),
            {"id": row},
        )
        return float(left.scalar_one())


async def test_a_drain_whose_clock_is_stepped_back_starts_no_row_past_its_start_window(
    make_outbox: MakeOutbox, database: Database, receiver: FakeReceiver
) -> None:
    host_clock = SkewedClock(timedelta(0))
    other_drain = make_outbox(deliver=receiver, host_clock=SystemClock())
    started_with: dict[str, float] = {}

    async def slow(message: Message) -> None:
        started_with[message.key] = await _lease_left(database, message.id)
        if len(started_with) == 1:
            # NTP steps this host's clock back two minutes.
            host_clock.skew = timedelta(minutes=-2)
        if len(started_with) == len(_KEYS):
            # The last row of the batch is still being delivered when its lease runs
            # out: another drain runs then.
            while await _lease_left(database, message.id) > -0.2:
                await asyncio.sleep(0.1)
            await other_drain.drain_once()
        else:
            await asyncio.sleep(_EACH)
        await receiver(message)

    outbox = make_outbox(
        deliver=slow,
        host_clock=host_clock,
        batch_size=len(_KEYS),
        concurrency=1,
        delivery_timeout=_TIMEOUT,
    )
    await enqueue(database, outbox, *_KEYS)
    await asyncio.wait_for(outbox.drain_once(), 120)

    late = {key: left for key, left in started_with.items() if left < _LEASE - _START_WINDOW - 1}
    twice = {key: count for key, count in receiver.delivered.items() if count > 1}
    assert (late, twice) == ({}, {}), f"lease left as each row started: {started_with}"
