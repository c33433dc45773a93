"""A delayed message whose moment comes while the wake-up's drain pass runs (after the
pass's last claim found nothing due, before the wake-up asks when the next row falls
due) is delivered by the wake-up at once, not left for the drain job's next tick (a
minute by default): the wake-up delivers every delayed message within its latency."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from app.db import Database, asyncpg_dsn
from app.outbox import DrainReport
from app.outbox.wakeup import listen_and_drain
from app.scheduler import FakeClock

from ..scheduler.conftest import eventually
from .conftest import T0, FakeReceiver, MakeOutbox

MOMENT = T0 + timedelta(seconds=10)


async def test_a_row_falling_due_during_the_wakeups_pass_is_delivered_by_the_wakeup(
    database: Database,
    database_url: str,
    clock: FakeClock,
    make_outbox: MakeOutbox,
    receiver: FakeReceiver,
) -> None:
    outbox = make_outbox("reminders")
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, {}, key="k", at=MOMENT)
    passes = 0

    async def drain(connection: Any) -> DrainReport:
        nonlocal passes
        report = await outbox.drain_on(connection)
        passes += 1
        if passes == 1:
            # The pass found nothing due; its moment comes as the pass ends (the time
            # a pass and its round trips take), before the wake-up's next probe.
            clock.set(MOMENT)
        return report

    wakeup = asyncio.create_task(
        listen_and_drain(asyncpg_dsn(database_url), "reminders", drain, clock)
    )

    async def delivered() -> bool:
        assert not wakeup.done(), wakeup
        return len(receiver.calls) == 1

    try:
        await eventually(delivered, what="the wake-up's delivery of the row due during its pass")
    finally:
        wakeup.cancel()
        await asyncio.gather(wakeup, return_exceptions=True)
