"""Delayed messages: ``enqueue(..., at=)`` or ``delay=``. Never delivered before that
moment on the database's clock (or a test's FakeClock), delivered soon after it by the
wake-up, which sleeps until the earliest scheduled row instead of polling."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from app import testing
from app.db import Database, asyncpg_dsn
from app.outbox import Outbox, OutboxArgumentError
from app.scheduler import FakeClock, Role, Scheduler

from ..conftest import SkewedClock, StartScheduler
from ..scheduler.conftest import eventually
from .conftest import T0, FakeReceiver, MakeOutbox

_DB_NOW = text("SELECT clock_timestamp()")
_ROW = text(
    "SELECT status, next_attempt_at, created_at, delivered_at FROM outbox_messages"
    " WHERE outbox = :outbox AND key = :key"
)
_COUNT = text("SELECT count(*) FROM outbox_messages")


async def _enqueue(database: Database, outbox: Outbox, key: str, **when: Any) -> None:
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, {"key": key}, key=key, **when)


async def _row(database: Database, outbox: str, key: str) -> Any:
    async with database.engine.connect() as conn:
        return (await conn.execute(_ROW, {"outbox": outbox, "key": key})).one()


async def _database_now(database: Database) -> datetime:
    async with database.engine.connect() as conn:
        moment: datetime = (await conn.execute(_DB_NOW)).scalar_one()
        return moment


async def test_the_test_kits_drain_delivers_a_message_at_its_moment_on_the_fake_clock(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox, receiver: FakeReceiver
) -> None:
    outbox = make_outbox("reminders")
    await _enqueue(database, outbox, "at", at=T0 + timedelta(hours=1))
    await _enqueue(database, outbox, "delay", delay=timedelta(minutes=90))
    assert (await testing.drain(outbox)).delivered == 0
    clock.advance(timedelta(hours=1) - timedelta(microseconds=1))
    assert (await testing.drain(outbox)).delivered == 0
    clock.advance(timedelta(microseconds=1))
    assert (await testing.drain(outbox)).delivered == 1
    clock.advance(timedelta(minutes=30))
    assert (await testing.drain(outbox)).delivered == 1
    assert [message.key for message in receiver.calls] == ["at", "delay"]


async def test_a_delay_is_counted_on_the_database_clock_not_the_hosts(
    database: Database, make_outbox: MakeOutbox, skewed_clock: SkewedClock
) -> None:
    outbox = make_outbox("reminders", host_clock=skewed_clock)
    before = await _database_now(database)
    await _enqueue(database, outbox, "k", delay=timedelta(hours=1))
    after = await _database_now(database)
    row = await _row(database, "reminders", "k")
    # The host's clock is two minutes off: a moment taken from it would miss this span.
    assert before + timedelta(hours=1) <= row.next_attempt_at <= after + timedelta(hours=1)


async def test_a_message_is_not_delivered_before_its_moment_on_the_database_clock(
    database: Database,
    make_outbox: MakeOutbox,
    receiver: FakeReceiver,
    skewed_clock: SkewedClock,
) -> None:
    outbox = make_outbox("reminders", host_clock=skewed_clock)
    at = await _database_now(database) + timedelta(seconds=1)
    await _enqueue(database, outbox, "k", at=at)
    assert (await outbox.drain_once()).delivered == 0

    async def delivered() -> bool:
        return (await outbox.drain_once()).delivered == 1

    await eventually(delivered, what="the delivery once the moment passed")
    row = await _row(database, "reminders", "k")
    assert row.delivered_at >= at
    assert row.next_attempt_at >= at


async def test_the_wakeup_sleeps_until_the_earliest_scheduled_row_and_delivers_it(
    clock: FakeClock,
    start_scheduler: StartScheduler,
    make_outbox: MakeOutbox,
    receiver: FakeReceiver,
    database: Database,
) -> None:
    scheduler = Scheduler()
    outbox = make_outbox("reminders", scheduler=scheduler)
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, {}, key="later", at=T0 + timedelta(hours=2))
        await outbox.enqueue(session, {}, key="sooner", at=T0 + timedelta(hours=1))
    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    # The wake-up parks once on the outbox's clock, until the earliest moment: a
    # sleep, not a loop that reads the rows every so often.
    await clock.wait_for_sleepers(1)
    clock.advance(timedelta(hours=1) - timedelta(seconds=1))
    assert clock.sleepers == 1
    assert receiver.calls == []
    clock.advance(timedelta(seconds=1))
    await eventually(lambda: _called(receiver, 1), what="the sooner row's delivery")
    await clock.wait_for_sleepers(1)
    clock.advance(timedelta(hours=1))
    await eventually(lambda: _called(receiver, 2), what="the later row's delivery")
    assert [message.key for message in receiver.calls] == ["sooner", "later"]


async def _called(receiver: FakeReceiver, times: int) -> bool:
    return len(receiver.calls) >= times


async def test_a_scheduled_message_is_delivered_by_the_wakeup_soon_after_its_moment(
    start_scheduler: StartScheduler,
    database: Database,
    database_url: str,
    receiver: FakeReceiver,
) -> None:
    # On the real clocks: the drain job's next tick is a minute away, so only the
    # wake-up can deliver within the bound.
    scheduler = Scheduler()
    outbox = Outbox("reminders", receiver, scheduler=scheduler)
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database_url))
    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    at = await _database_now(database) + timedelta(seconds=2)
    await _enqueue(database, outbox, "k", at=at)

    async def delivered() -> bool:
        return bool((await _row(database, "reminders", "k")).status == "delivered")

    await eventually(delivered, timeout=12, what="the wake-up's delivery")
    row = await _row(database, "reminders", "k")
    assert at <= row.delivered_at < at + timedelta(seconds=5)
    assert len(receiver.calls) == 1


@pytest.mark.parametrize(
    ("when", "names"),
    [
        ({"at": datetime(2030, 1, 1)}, "at"),
        ({"at": T0 + timedelta(days=3700)}, "at"),
        ({"delay": timedelta(days=3700)}, "delay"),
        ({"delay": timedelta(seconds=-1)}, "delay"),
        ({"at": T0, "delay": timedelta(seconds=5)}, "at"),
        ({"at": "2030-01-01T00:00:00+00:00"}, "at"),
        ({"delay": 5}, "delay"),
    ],
    ids=["naive", "past-ten-years", "delay-past-ten-years", "negative", "both", "text", "int"],
)
async def test_enqueue_refuses_a_moment_it_cannot_honour_and_writes_nothing(
    database: Database, make_outbox: MakeOutbox, when: dict[str, Any], names: str
) -> None:
    outbox = make_outbox("reminders")
    with pytest.raises(OutboxArgumentError) as refused:
        await _enqueue(database, outbox, "k", **when)
    assert refused.value.argument == names
    assert f"{names}=" in str(refused.value)
    async with database.engine.connect() as conn:
        assert (await conn.execute(_COUNT)).scalar_one() == 0


async def test_a_scheduled_message_due_at_once_when_its_moment_has_passed(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    outbox = make_outbox("reminders")
    await _enqueue(database, outbox, "k", at=T0.astimezone(UTC) - timedelta(days=1))
    assert (await testing.drain(outbox)).delivered == 1


async def test_a_reset_makes_a_scheduled_message_due_now(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox, receiver: FakeReceiver
) -> None:
    outbox = make_outbox("reminders")
    async with database.sessions() as session, session.begin():
        row = await outbox.enqueue(session, {}, key="k", delay=timedelta(days=1))
    await outbox.reset(row.id)
    assert (await testing.drain(outbox)).delivered == 1
    assert (await _row(database, "reminders", "k")).status == "delivered"


async def test_a_sync_enqueue_delays_as_enqueue_does(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    outbox = make_outbox("reminders")
    with database.sync_sessions() as session, session.begin():
        outbox.enqueue_sync(session, {}, key="k", delay=timedelta(minutes=5))
    assert (await testing.drain(outbox)).delivered == 0
    clock.advance(timedelta(minutes=5))
    assert (await testing.drain(outbox)).delivered == 1
