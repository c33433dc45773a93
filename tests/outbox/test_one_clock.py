"""The outbox reads every lease and every due time on the database server's clock, never
on a host's: a process whose clock runs two minutes ahead of the database's, or two
behind (further off than the 60 s row lease), takes no row another drain is delivering,
resets none, and neither delays nor hurries a row's due time."""

import pytest
from sqlalchemy import text

from app.db import Database
from app.outbox import Message, MessageInFlightError, PermanentDeliveryError
from app.scheduler import SystemClock

from ..conftest import SkewedClock
from .conftest import Delivering, FakeReceiver, MakeOutbox, enqueue

# Seconds until a row is due, on the database server's clock.
_DUE_IN = text(
    "SELECT extract(epoch FROM next_attempt_at - clock_timestamp()) FROM outbox_messages"
)


async def _due_in(database: Database) -> float:
    async with database.engine.connect() as conn:
        seconds: float = (await conn.execute(_DUE_IN)).scalar_one()
        return seconds


async def test_a_drain_on_a_host_two_minutes_off_takes_no_row_another_drain_is_delivering(
    make_outbox: MakeOutbox,
    delivering: Delivering,
    receiver: FakeReceiver,
    skewed_clock: SkewedClock,
) -> None:
    await make_outbox(host_clock=skewed_clock).drain_once()
    report = await delivering.finish()
    assert (receiver.calls, report.delivered, report.lost) == ([], 1, 0)


async def test_an_inline_attempt_on_a_host_two_minutes_off_takes_no_row_a_drain_is_delivering(
    make_outbox: MakeOutbox,
    delivering: Delivering,
    receiver: FakeReceiver,
    skewed_clock: SkewedClock,
) -> None:
    await make_outbox(host_clock=skewed_clock).attempt(delivering.row)
    report = await delivering.finish()
    assert (receiver.calls, report.delivered, report.lost) == ([], 1, 0)


async def test_a_reset_on_a_host_two_minutes_off_answers_in_flight_for_a_row_being_delivered(
    make_outbox: MakeOutbox, delivering: Delivering, skewed_clock: SkewedClock
) -> None:
    with pytest.raises(MessageInFlightError):
        await make_outbox(host_clock=skewed_clock).reset(delivering.row)


async def test_a_row_enqueued_on_a_host_two_minutes_off_is_due_at_once(
    make_outbox: MakeOutbox, database: Database, skewed_clock: SkewedClock
) -> None:
    await enqueue(database, make_outbox(host_clock=skewed_clock), "k1")
    assert (await make_outbox(host_clock=SystemClock()).drain_once()).delivered == 1


async def test_a_drain_on_a_host_two_minutes_off_delivers_a_row_due_now(
    make_outbox: MakeOutbox, database: Database, skewed_clock: SkewedClock
) -> None:
    await enqueue(database, make_outbox(host_clock=SystemClock()), "k1")
    assert (await make_outbox(host_clock=skewed_clock).drain_once()).delivered == 1


async def test_an_inline_attempt_on_a_host_two_minutes_off_delivers_the_row_it_enqueued(
    make_outbox: MakeOutbox,
    database: Database,
    receiver: FakeReceiver,
    skewed_clock: SkewedClock,
) -> None:
    outbox = make_outbox(host_clock=skewed_clock)
    [row] = await enqueue(database, outbox, "k1")
    await outbox.attempt(row)
    assert [message.key for message in receiver.calls] == ["k1"]


async def test_a_retry_on_a_host_two_minutes_off_waits_its_backoff_on_the_database_clock(
    make_outbox: MakeOutbox,
    database: Database,
    receiver: FakeReceiver,
    skewed_clock: SkewedClock,
) -> None:
    def refuse(message: Message) -> None:
        raise ConnectionError("receiver down")

    receiver.behaviour = refuse
    await enqueue(database, make_outbox(host_clock=SystemClock()), "k1")
    assert (await make_outbox(host_clock=skewed_clock, backoff=(30,)).drain_once()).retried == 1
    assert 20 < await _due_in(database) <= 30


async def test_a_stuck_row_reset_on_a_host_two_minutes_off_is_due_at_once(
    make_outbox: MakeOutbox,
    database: Database,
    receiver: FakeReceiver,
    skewed_clock: SkewedClock,
) -> None:
    def refuse_the_first_call(message: Message) -> None:
        if len(receiver.calls) == 1:
            raise PermanentDeliveryError("HTTP 400")

    receiver.behaviour = refuse_the_first_call
    true_host = make_outbox(host_clock=SystemClock())
    [row] = await enqueue(database, true_host, "k1")
    assert (await true_host.drain_once()).stuck == 1
    await make_outbox(host_clock=skewed_clock).reset(row)
    assert (await true_host.drain_once()).delivered == 1
