"""An outbox with nothing pending costs its wake-up nothing: after its first pass it
waits for a NOTIFY (or the earliest delayed row's moment), and runs no drain pass, no
statement, until one comes."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg

from app.db import Database, asyncpg_dsn
from app.outbox import DrainReport
from app.outbox.wakeup import listen_and_drain, seconds_until_due
from app.scheduler import FakeClock

from ..scheduler.conftest import eventually
from .conftest import FakeReceiver, MakeOutbox


async def test_with_nothing_pending_no_row_is_due_ever(
    database_url: str, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    make_outbox("reminders")
    connection = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        seconds, _ = await seconds_until_due(connection, "reminders", clock, clock.now())
    finally:
        await connection.close()
    assert seconds is None


async def test_an_idle_outboxs_wakeup_runs_one_pass_then_waits_for_a_notification(
    database: Database,
    database_url: str,
    clock: FakeClock,
    make_outbox: MakeOutbox,
    receiver: FakeReceiver,
) -> None:
    outbox = make_outbox("reminders")
    passes = 0

    async def drain(connection: Any) -> DrainReport:
        nonlocal passes
        passes += 1
        return await outbox.drain_on(connection)

    wakeup = asyncio.create_task(
        listen_and_drain(asyncpg_dsn(database_url), "reminders", drain, clock)
    )
    try:
        await eventually(lambda: _is(passes >= 1), what="the wake-up's first pass")
        # Nothing to wait on here but time: a wake-up that took "nothing pending" for
        # "due now" ran thousands of passes a second.
        await asyncio.sleep(0.5)
        assert passes == 1
        async with database.sessions() as session, session.begin():
            await outbox.enqueue(session, {}, key="k")
        await eventually(lambda: _is(len(receiver.calls) == 1), what="the notified delivery")
    finally:
        wakeup.cancel()
        await asyncio.gather(wakeup, return_exceptions=True)


async def _is(value: bool) -> bool:
    return value
