"""A claim's lease covers each row until its own delivery ends, and a drain reports only
the outcomes the database accepted."""

import asyncio
import collections
import itertools
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.outbox import DrainReport, Message, Outbox
from app.scheduler import FakeClock

from .conftest import T0, MakeOutbox, enqueue

_TIMEOUT = 60.0
_LEASE = timedelta(seconds=_TIMEOUT + 30)  # delivery_timeout and the drain's margin
# A delivery starts only while it can end, cut off at delivery_timeout, with half the
# margin left on its lease for the outcome write.
_LATEST_START = timedelta(seconds=_TIMEOUT + 15)
# The clock moves in steps, one at a time, each after a database round trip: between
# a claim and the start of its first row's delivery (a round trip and a loop step) it
# moves a few steps at most, far less than the lease's start window.
_MAX_STEP = 2.0


async def test_a_row_whose_lease_ran_out_behind_the_gate_is_delivered_once(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock
) -> None:
    # Every delivery takes 25 s of the 30 s delivery_timeout, one at a time: the third
    # row starts 50 s into the pass, and 11 s later (61 s, past a lease taken when the
    # pass began) another drain looks for due rows.
    delivered: collections.Counter[str] = collections.Counter()
    third_started = asyncio.Event()
    release = asyncio.Event()

    async def slow(message: Message) -> None:
        clock.advance(25 if message.key != "k3" else 11)
        if message.key == "k3" and not third_started.is_set():
            third_started.set()
            await release.wait()
        delivered[message.key] += 1

    outbox = make_outbox(deliver=slow, batch_size=3, concurrency=1, delivery_timeout=30)
    await enqueue(database, outbox, "k1", "k2", "k3")
    first = asyncio.create_task(outbox.drain_once())
    await asyncio.wait_for(third_started.wait(), 10)
    second = await outbox.drain_once()
    release.set()
    await first
    assert delivered == {"k1": 1, "k2": 1, "k3": 1}
    assert second.delivered == 0


@pytest.mark.parametrize(
    ("outcome", "uncounted"), [("succeeds", "delivered"), ("fails", "retried")]
)
async def test_an_outcome_the_database_refused_is_not_counted_and_is_logged_as_claim_lost(
    make_outbox: MakeOutbox,
    database: Database,
    clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
    outcome: str,
    uncounted: str,
) -> None:
    caplog.set_level(logging.WARNING, logger="app.outbox")
    started = asyncio.Event()
    release = asyncio.Event()

    async def paused_once(message: Message) -> None:
        if not started.is_set():
            # The process stalls mid-delivery for longer than the lease.
            started.set()
            await release.wait()
            if outcome == "fails":
                raise ConnectionError("receiver went away")

    outbox = make_outbox(deliver=paused_once, delivery_timeout=30)
    [row] = await enqueue(database, outbox, "k1")
    stalled = asyncio.create_task(outbox.drain_once())
    await asyncio.wait_for(started.wait(), 10)
    clock.advance(30 + 30 + 1)
    assert (await outbox.drain_once()).delivered == 1
    release.set()
    report = await stalled
    assert getattr(report, uncounted) == 0
    assert report.lost == 1
    lost = [r for r in caplog.records if getattr(r, "action", None) == "outbox.claim_lost"]
    assert [(r.outbox, r.row) for r in lost] == [("grants", row)]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _Call:
    """What the receiver does on one call: take ``seconds`` of clock time (at most
    delivery_timeout), then fail or succeed."""

    seconds: float
    fails: bool


_CALLS = st.builds(
    _Call,
    seconds=st.integers(0, 4).map(lambda quarters: quarters * _TIMEOUT / 4),
    fails=st.sampled_from([False, False, False, True]),
)

_names = itertools.count()


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    keys=st.integers(1, 8),
    batch_size=st.integers(1, 6),
    concurrency=st.integers(1, 3),
    calls=st.lists(_CALLS, min_size=1, max_size=12),
    drains_at=st.sets(st.integers(0, 12), min_size=1, max_size=4),
)
async def test_every_key_is_delivered_once_and_counted_as_the_database_accepted_it(
    database: Database,
    database_url: str,
    keys: int,
    batch_size: int,
    concurrency: int,
    calls: list[_Call],
    drains_at: set[int],
) -> None:
    # Drains start while others deliver (a NOTIFY wake-up, another worker). The clock
    # moves while receivers run, but never so far that a delivery already under way
    # outlives delivery_timeout: a real one is cut off there. Rows claimed and waiting
    # for a slot are not guarded: their lease, and the rule that a row starts only
    # while its lease covers the whole delivery, are what is tested.
    clock = FakeClock(T0)
    name = f"prop_{next(_names)}"
    started: dict[int, datetime] = {}
    made: list[str] = []
    refused: list[str] = []
    started_late: list[str] = []
    delivered: collections.Counter[str] = collections.Counter()
    drains: list[asyncio.Task[DrainReport]] = []
    settling = False
    one_step_at_a_time = asyncio.Lock()

    async def headroom() -> float:
        async with database.engine.connect() as conn:
            held = await conn.execute(
                text(
                    "SELECT id, next_attempt_at FROM outbox_messages"
                    " WHERE outbox = :o AND claimed_by IS NOT NULL"
                ),
                {"o": name},
            )
            under_way = [
                started[row]
                for row, lease_until in held
                if row in started and started[row] >= lease_until - _LEASE
            ]
        return min(
            (_TIMEOUT - (clock.now() - start).total_seconds() for start in under_way),
            default=_TIMEOUT,
        )

    async def lease_until(row: int) -> datetime:
        async with database.engine.connect() as conn:
            due = await conn.execute(
                text("SELECT next_attempt_at FROM outbox_messages WHERE id = :id"), {"id": row}
            )
            return due.scalar_one()  # type: ignore[no-any-return]

    async def receive(message: Message) -> None:
        index = len(made)
        made.append(message.key)
        start = started[message.id] = clock.now()
        if start + _LATEST_START > await lease_until(message.id):
            started_late.append(message.key)
        if settling:
            delivered[message.key] += 1
            return
        call = calls[index % len(calls)]
        left = call.seconds
        while left > 0:
            async with one_step_at_a_time:
                step = max(0.0, min(left, _MAX_STEP, await headroom()))
                clock.advance(step)
            # No headroom left: the delivery has used its whole delivery_timeout.
            left = left - step if step else 0
        if index in drains_at:
            drains.append(asyncio.create_task(outbox.drain_once()))
        if call.fails:
            refused.append(message.key)
            raise ConnectionError("receiver refused")
        delivered[message.key] += 1

    outbox = Outbox(
        name, receive, batch_size=batch_size, concurrency=concurrency, delivery_timeout=_TIMEOUT
    )
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database_url), clock=clock)
    await enqueue(database, outbox, *(f"k{n}" for n in range(keys)))
    reports = [await outbox.drain_once()]
    while drains:
        reports.append(await drains.pop())
    settling = True
    while sum(delivered.values()) < keys and len(reports) < 50:
        clock.advance(3600)
        reports.append(await outbox.drain_once())

    assert delivered == {f"k{n}": 1 for n in range(keys)}
    assert started_late == []
    async with database.engine.connect() as conn:
        attempts = await conn.execute(
            text("SELECT sum(attempts) FROM outbox_messages WHERE outbox = :o"), {"o": name}
        )
        accepted = attempts.scalar_one()
    assert sum(r.delivered for r in reports) == keys
    assert sum(r.retried for r in reports) == len(refused)
    assert sum(r.delivered + r.retried + r.stuck for r in reports) == accepted == len(made)
    assert sum(r.lost for r in reports) == 0


async def test_a_pass_whose_connection_dies_raises_the_database_error(
    make_outbox: MakeOutbox, database: Database
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def held(message: Message) -> None:
        started.set()
        await release.wait()

    outbox = make_outbox(deliver=held)
    await enqueue(database, outbox, "k1")
    drain = asyncio.create_task(outbox.drain_once())
    await asyncio.wait_for(started.wait(), 10)
    async with database.engine.connect() as conn:
        killed = await conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND query LIKE '%SET claimed_by = $%'"
            )
        )
        assert killed.scalars().all() == [True]
    release.set()
    # Which error asyncpg raises on a killed connection depends on timing; it is always
    # the driver's own, never an ExceptionGroup that hides it.
    with pytest.raises(Exception) as raised:
        await drain
    assert type(raised.value).__module__.startswith("asyncpg."), repr(raised.value)
