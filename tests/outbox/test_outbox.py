"""The outbox contract: enqueue in the caller's transaction, backoff, stuck, never lost."""

import asyncio
import random
import re
import subprocess
import sys
from datetime import timedelta
from typing import Any

import asyncpg
import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, asyncpg_dsn
from app.outbox import (
    HttpTransport,
    Message,
    MessageDeliveredError,
    MessageInFlightError,
    PayloadError,
    PermanentDeliveryError,
    UnknownMessageError,
    retry_delay,
    sql,
)
from app.scheduler import FakeClock

from .conftest import FakeReceiver, MakeOutbox


async def _enqueue(database: Database, outbox: object, key: str, payload: object = None) -> int:
    async with database.sessions() as session, session.begin():
        enqueued = await outbox.enqueue(session, payload or {"key": key}, key=key)  # type: ignore[attr-defined]
    return int(enqueued.id)


async def _row(engine: AsyncEngine, row_id: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT * FROM outbox_messages WHERE id = :id"), {"id": row_id}
        )
        return dict(result.one()._mapping)


def _unreachable(message: Message) -> None:
    raise httpx.ConnectError("connection refused")


def test_backoff_table_known_answer() -> None:
    assert [retry_delay(n) for n in range(1, 9)] == [5, 15, 60, 300, 900, 3600, 3600, 3600]


def test_claim_sql_known_answer() -> None:
    lease_now = "COALESCE(CAST(:lease_now AS timestamptz), clock_timestamp())"
    expected = (
        "UPDATE outbox_messages AS m "
        f"SET claimed_by = :token, next_attempt_at = ({lease_now} + "
        "make_interval(secs => CAST(:lease_seconds AS double precision))), "
        f"updated_at = {lease_now} "
        "WHERE m.id IN ( SELECT id FROM outbox_messages "
        "WHERE outbox = :outbox AND status = 'pending' "
        f"AND next_attempt_at <= (SELECT {lease_now}) "
        "ORDER BY next_attempt_at, id LIMIT :batch_size FOR UPDATE SKIP LOCKED ) "
        "RETURNING m.id, m.key, m.payload, m.attempts"
    )
    assert re.sub(r"\s+", " ", str(sql.CLAIM_DUE)).strip() == expected


async def test_seed_check_7_unreachable_receiver_backs_off_then_sticks(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock, receiver: FakeReceiver
) -> None:
    receiver.behaviour = _unreachable
    outbox = make_outbox(max_attempts=24)
    row_id = await _enqueue(database, outbox, "grant-1")
    for _ in range(6):
        row = await _row(database.engine, row_id)
        clock.set(max(clock.now(), row["next_attempt_at"]))
        report = await outbox.drain_once()
        assert report.retried == 1
    row = await _row(database.engine, row_id)
    assert row["attempts"] == 6
    assert row["status"] == "pending"
    assert row["next_attempt_at"] == clock.now() + timedelta(seconds=3600)
    while row["status"] == "pending":
        clock.set(row["next_attempt_at"])
        await outbox.drain_once()
        row = await _row(database.engine, row_id)
    assert row["status"] == "stuck"
    assert row["attempts"] == 24
    assert "connection refused" in str(row["last_error"])


@pytest.mark.parametrize(
    ("status", "outcome"),
    [
        (400, "stuck"),
        (404, "stuck"),
        (422, "stuck"),
        (408, "pending"),
        (429, "pending"),
        (500, "pending"),
        (503, "pending"),
    ],
)
async def test_http_transport_maps_statuses(
    make_outbox: MakeOutbox, database: Database, status: int, outcome: str
) -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, text="nope")

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    outbox = make_outbox(deliver=HttpTransport("http://receiver.test/grants", client=client))
    row_id = await _enqueue(database, outbox, "grant-7", {"amount": 500})
    await outbox.drain_once()
    await client.aclose()
    row = await _row(database.engine, row_id)
    assert (row["status"], row["attempts"]) == (outcome, 1)
    assert seen[0].headers["Idempotency-Key"] == "grants:grant-7"
    assert seen[0].read() == b'{"amount":500}'


async def test_http_2xx_delivers(make_outbox: MakeOutbox, database: Database) -> None:
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(201)))
    outbox = make_outbox(deliver=HttpTransport("http://receiver.test/", client=client))
    row_id = await _enqueue(database, outbox, "ok")
    report = await outbox.drain_once()
    await client.aclose()
    assert report.delivered == 1
    assert (await _row(database.engine, row_id))["status"] == "delivered"


async def test_permanent_error_makes_the_row_stuck_at_once(
    make_outbox: MakeOutbox, database: Database, receiver: FakeReceiver
) -> None:
    def refuse(message: Message) -> None:
        raise PermanentDeliveryError("workspace 7 does not exist")

    receiver.behaviour = refuse
    outbox = make_outbox()
    row_id = await _enqueue(database, outbox, "grant-2")
    report = await outbox.drain_once()
    assert report.stuck == 1
    row = await _row(database.engine, row_id)
    assert (row["status"], row["attempts"]) == ("stuck", 1)


async def test_rolled_back_enqueue_leaves_no_row_and_delivers_nothing(
    make_outbox: MakeOutbox, database: Database, receiver: FakeReceiver
) -> None:
    outbox = make_outbox()
    async with database.sessions() as session:
        await session.begin()
        await outbox.enqueue(session, {"amount": 1}, key="rolled-back")
        await session.rollback()
    report = await outbox.drain_once()
    assert report.delivered == 0
    assert receiver.calls == []
    async with database.engine.connect() as conn:
        count = await conn.execute(text("SELECT count(*) FROM outbox_messages"))
        assert count.scalar_one() == 0


async def test_enqueue_of_an_existing_key_adds_no_second_row(
    make_outbox: MakeOutbox, database: Database
) -> None:
    outbox = make_outbox()
    first = await _enqueue(database, outbox, "grant-3")
    async with database.sessions() as session, session.begin():
        again = await outbox.enqueue(session, {"amount": 99}, key="grant-3")
    assert again.id == first
    assert not again.created


async def test_an_enqueue_wakes_the_drains_once_and_a_key_already_there_wakes_none(
    make_outbox: MakeOutbox, database: Database, database_url: str
) -> None:
    grants, other = make_outbox("grants"), make_outbox("other")
    woken: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await listener.add_listener(
            sql.NOTIFY_CHANNEL, lambda _conn, _pid, _channel, outbox: woken.put_nowait(outbox)
        )
        await _enqueue(database, grants, "g-1")
        await _enqueue(database, grants, "g-1")
        # Notifications arrive in commit order: once this one is in, any of the repeat's is.
        await _enqueue(database, other, "o-1")
        heard = [await asyncio.wait_for(woken.get(), 10) for _ in range(2)]
    finally:
        await listener.close()
    assert heard == ["grants", "other"]
    assert woken.empty()


async def test_payload_that_is_not_json_names_the_field(
    make_outbox: MakeOutbox, database: Database
) -> None:
    outbox = make_outbox()
    async with database.sessions() as session:
        with pytest.raises(PayloadError, match=r"payload\['grant'\]\['at'\] is object"):
            await outbox.enqueue(session, {"grant": {"at": object()}}, key="bad")


async def test_hanging_receiver_is_cut_off_and_retried(
    make_outbox: MakeOutbox, database: Database
) -> None:
    async def hang(message: Message) -> None:
        await asyncio.Event().wait()

    outbox = make_outbox(deliver=hang, delivery_timeout=0.1)
    row_id = await _enqueue(database, outbox, "slow")
    report = await outbox.drain_once()
    assert report.retried == 1
    row = await _row(database.engine, row_id)
    assert row["status"] == "pending"
    assert "delivery_timeout" in str(row["last_error"])


async def test_four_concurrent_drains_deliver_every_key_exactly_once(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock, receiver: FakeReceiver
) -> None:
    chance = random.Random(7)

    def flaky(message: Message) -> None:
        roll = chance.random()
        if roll < 0.20:
            raise httpx.HTTPStatusError("500", request=None, response=None)  # type: ignore[arg-type]
        if roll < 0.25:
            raise httpx.HTTPStatusError("429", request=None, response=None)  # type: ignore[arg-type]

    receiver.behaviour = flaky
    outbox = make_outbox(batch_size=50, concurrency=10)
    keys = [f"row-{n}" for n in range(2000)]
    async with database.sessions() as session, session.begin():
        for key in keys:
            await outbox.enqueue(session, {"key": key}, key=key)
    while True:
        reports = await asyncio.gather(*(outbox.drain_once() for _ in range(4)))
        if (
            not any(report.retried for report in reports)
            and sum(report.delivered for report in reports) == 0
        ):
            break
        clock.advance(3600)
    assert sorted(receiver.delivered) == sorted(keys)
    assert set(receiver.delivered.values()) == {1}
    async with database.engine.connect() as conn:
        statuses = await conn.execute(
            text("SELECT status, count(*) FROM outbox_messages GROUP BY status")
        )
        assert dict(statuses.all()) == {"delivered": 2000}


async def test_reset_stuck_row_gets_it_delivered(
    make_outbox: MakeOutbox, database: Database, receiver: FakeReceiver
) -> None:
    def refuse(message: Message) -> None:
        raise PermanentDeliveryError("not yet")

    receiver.behaviour = refuse
    outbox = make_outbox()
    row_id = await _enqueue(database, outbox, "grant-4")
    await outbox.drain_once()
    receiver.behaviour = lambda message: None
    await outbox.reset(row_id)
    row = await _row(database.engine, row_id)
    assert (row["status"], row["attempts"]) == ("pending", 0)
    assert (await outbox.drain_once()).delivered == 1


async def test_reset_of_an_unknown_or_delivered_row_is_refused(
    make_outbox: MakeOutbox, database: Database
) -> None:
    outbox = make_outbox()
    row_id = await _enqueue(database, outbox, "grant-5")
    await outbox.drain_once()
    with pytest.raises(UnknownMessageError, match="has no message 999999"):
        await outbox.reset(999999)
    with pytest.raises(MessageDeliveredError, match="was delivered"):
        await outbox.reset(row_id)


async def test_reset_of_a_row_a_drain_holds_is_refused_and_the_row_is_delivered_once(
    make_outbox: MakeOutbox, database: Database
) -> None:
    started = asyncio.Event()
    release = asyncio.Event()
    delivered: list[str] = []

    async def held_once(message: Message) -> None:
        if not started.is_set():
            started.set()
            await release.wait()
        delivered.append(message.key)

    outbox = make_outbox(deliver=held_once)
    row_id = await _enqueue(database, outbox, "grant-10")
    drain = asyncio.create_task(outbox.drain_once())
    await asyncio.wait_for(started.wait(), 5)
    with pytest.raises(MessageInFlightError, match="wait for the drain") as refused:
        await outbox.reset(row_id)
    assert refused.value.message_id == row_id
    assert (await outbox.drain_once()).delivered == 0
    release.set()
    await drain
    assert delivered == ["grant-10"]


async def test_reset_of_a_row_whose_lease_ran_out_makes_it_due_now(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock
) -> None:
    outbox = make_outbox()
    row_id = await _enqueue(database, outbox, "grant-11")
    async with database.engine.begin() as conn:
        # A drain claimed the row and died; its lease has just run out.
        await conn.execute(
            text(
                "UPDATE outbox_messages SET claimed_by = gen_random_uuid(), attempts = 3,"
                " next_attempt_at = :now WHERE id = :id"
            ),
            {"id": row_id, "now": clock.now()},
        )
    await outbox.reset(row_id)
    row = await _row(database.engine, row_id)
    assert (row["status"], row["attempts"], row["claimed_by"]) == ("pending", 0, None)


async def test_inline_attempt_leaves_a_row_another_drain_holds(
    make_outbox: MakeOutbox, database: Database, receiver: FakeReceiver
) -> None:
    outbox = make_outbox()
    row_id = await _enqueue(database, outbox, "grant-6")
    async with database.engine.begin() as conn:
        # Another drain is mid-claim: it holds the row lock.
        await conn.execute(
            text("SELECT id FROM outbox_messages WHERE id = :id FOR UPDATE"), {"id": row_id}
        )
        await outbox.attempt(row_id)
    assert receiver.calls == []
    await outbox.attempt(row_id)
    assert [message.key for message in receiver.calls] == ["grant-6"]


async def test_row_of_a_drain_killed_mid_delivery_is_retried_after_its_lease(
    make_outbox: MakeOutbox, database: Database, clock: FakeClock, receiver: FakeReceiver
) -> None:
    started = asyncio.Event()

    async def dies(message: Message) -> None:
        started.set()
        await asyncio.Event().wait()

    dying = make_outbox("dying_view", deliver=dies)
    survivor = make_outbox("grants")
    row_id = await _enqueue(database, survivor, "grant-8")
    # The same table seen through an outbox of the same name in a "dead" process.
    dying.name = "grants"
    killed = asyncio.create_task(dying.drain_once())
    await asyncio.wait_for(started.wait(), 5)
    killed.cancel()
    assert (await survivor.drain_once()).delivered == 0
    clock.advance(survivor.delivery_timeout + 31)
    assert (await survivor.drain_once()).delivered == 1
    assert receiver.calls[0].idempotency_key == "grants:grant-8"
    assert (await _row(database.engine, row_id))["attempts"] == 1


async def test_sync_enqueue_from_a_thread_job_is_delivered(
    make_outbox: MakeOutbox, database: Database, receiver: FakeReceiver
) -> None:
    outbox = make_outbox()

    def thread_job() -> None:
        with database.sync_sessions() as session, session.begin():
            outbox.enqueue_sync(session, {"amount": 3}, key="from-thread")

    await asyncio.to_thread(thread_job)
    assert (await outbox.drain_once()).delivered == 1
    assert [message.key for message in receiver.calls] == ["from-thread"]


@pytest.mark.multiprocess
def test_four_drain_processes_deliver_every_key_exactly_once(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE received (key text NOT NULL, pid int NOT NULL)")
        conn.execute(
            "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
            " next_attempt_at, created_at, updated_at)"
            " SELECT 'shared', 'k' || n, '{}', 'pending', 0, now(), now(), now()"
            " FROM generate_series(1, 2000) AS n"
        )
    workers = [
        subprocess.Popen([sys.executable, "-m", "tests.procs.drain_worker", database_url, str(n)])
        for n in range(4)
    ]
    assert [worker.wait(180) for worker in workers] == [0, 0, 0, 0]
    with psycopg.connect(database_url) as conn:
        twice = conn.execute("SELECT key FROM received GROUP BY key HAVING count(*) > 1").fetchall()
        delivered = conn.execute("SELECT count(DISTINCT key) FROM received").fetchone()
        drains = {pid for (pid,) in conn.execute("SELECT DISTINCT pid FROM received")}
        statuses = conn.execute(
            "SELECT status, count(*) FROM outbox_messages GROUP BY status"
        ).fetchall()
    assert twice == []
    assert delivered == (2000,)
    assert statuses == [("delivered", 2000)]
    assert len(drains) > 1, "only one process delivered anything"
    assert drains <= {worker.pid for worker in workers}


async def test_a_failure_whose_text_holds_a_nul_byte_is_recorded_and_retried(
    make_outbox: MakeOutbox, database: Database
) -> None:
    def quote_raw_bytes(message: Message) -> None:
        raise RuntimeError("receiver echoed 'ab\x00cd' and a lone \udc80")

    outbox = make_outbox(deliver=FakeReceiver(behaviour=quote_raw_bytes))
    async with database.sessions() as session:
        await outbox.enqueue(session, {"n": 1}, key="nul")
        await session.commit()
    report = await outbox.drain_once()
    assert report.retried == 1
    async with database.engine.connect() as conn:
        error = (await conn.execute(text("SELECT last_error FROM outbox_messages"))).scalar_one()
    assert "\\x00" in error
