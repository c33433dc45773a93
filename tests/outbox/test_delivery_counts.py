"""The last hour's deliveries are counted as rows are delivered (per outbox and minute,
in the database: migrations 0027 and 0028), whatever delivers them, and a deleted row leaves the
count of its delivery as it was."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import asyncpg
import psycopg
from alembic import command
from sqlalchemy import text

from app import testing
from app.db import Database, alembic_config, asyncpg_dsn, migrate
from app.operations import outboxes
from app.outbox.connection import prepare_connection
from app.retention import RetentionPolicy, prune
from app.scheduler import FakeClock
from app.scheduler.clock import lease_now

from .conftest import MakeOutbox, enqueue


async def _delivered(database: Database, clock: FakeClock, outbox: str) -> int:
    summary = await outboxes.outbox_summary(database.engine, lease_now(clock))
    return int(next(e["counts"]["delivered"] for e in summary if e["name"] == outbox))


async def _delivered_by_a_drain(database: Database, make_outbox: MakeOutbox, *keys: str) -> None:
    """Messages ``keys`` of outbox ``counted``, enqueued and delivered by one pass."""
    outbox = make_outbox("counted")
    async with database.sessions() as session, session.begin():
        for key in keys:
            await outbox.enqueue(session, {}, key=key)
    await testing.drain(outbox)


async def test_the_drains_deliveries_are_counted_for_an_hour(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    await _delivered_by_a_drain(database, make_outbox, "a", "b", "c")
    assert await _delivered(database, clock, "counted") == 3
    clock.advance(timedelta(minutes=59))
    assert await _delivered(database, clock, "counted") == 3
    clock.advance(timedelta(minutes=2))
    assert await _delivered(database, clock, "counted") == 0


async def test_a_deleted_delivered_row_leaves_its_delivery_counted(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    await _delivered_by_a_drain(database, make_outbox, "a", "b")
    async with database.engine.begin() as conn:
        await conn.execute(text("DELETE FROM outbox_messages WHERE key = 'a'"))
    assert await _delivered(database, clock, "counted") == 2


async def test_a_row_taken_out_of_delivered_is_no_longer_counted(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    await _delivered_by_a_drain(database, make_outbox, "a", "b")
    async with database.engine.begin() as conn:
        await conn.execute(text("UPDATE outbox_messages SET status = 'stuck' WHERE key = 'a'"))
    assert await _delivered(database, clock, "counted") == 1


async def test_retention_forgets_the_counts_of_deliveries_a_day_old(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    await _delivered_by_a_drain(database, make_outbox, "a")
    clock.advance(timedelta(days=1, minutes=1))
    async with database.engine.begin() as conn:  # the schedule whose pass prunes it
        await conn.execute(text("INSERT INTO outbox_schedules VALUES ('counted', 'default')"))
    async with database.sessions() as session:
        policy = RetentionPolicy(run_history_days=30, run_history_keep=3, outbox_delivered_days=7)
        await prune(session, "default", policy, lease_now(clock))
    async with database.engine.connect() as conn:
        left = await conn.execute(text("SELECT count(*) FROM outbox_delivered_minutes"))
        assert left.scalar_one() == 0


async def test_deliveries_spread_over_minutes_are_counted_exactly(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    outbox = make_outbox("counted", batch_size=7)
    await enqueue(database, outbox, *(f"k{n}" for n in range(30)))
    while (await outbox.drain_once()).delivered:
        clock.advance(20)
    assert await _delivered(database, clock, "counted") == 30


async def test_concurrent_drains_are_counted_exactly(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    # Each drain's connection adds to its own shard of a minute, or waits for a commit.
    outbox = make_outbox("counted", batch_size=20)
    await enqueue(database, outbox, *(f"k{n}" for n in range(400)))
    delivered = 0
    while reports := await asyncio.gather(*(outbox.drain_once() for _ in range(4))):
        if not any(report.delivered for report in reports):
            break
        delivered += sum(report.delivered for report in reports)
    assert delivered == 400
    assert await _delivered(database, clock, "counted") == 400


async def test_a_forgotten_outbox_leaves_no_count_behind(
    database: Database, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    await _delivered_by_a_drain(database, make_outbox, "a", "b")
    async with database.engine.begin() as conn:  # claimed by a schedule with no drain job
        await conn.execute(text("INSERT INTO outbox_schedules VALUES ('counted', 'other')"))
    assert await outboxes.forget_outbox(database.engine, "counted") == 2
    async with database.engine.connect() as conn:
        left = await conn.execute(text("SELECT count(*) FROM outbox_delivered_minutes"))
        assert left.scalar_one() == 0


async def test_an_outcome_write_does_not_wait_on_a_count_another_transaction_holds(
    database: Database, database_url: str, clock: FakeClock, make_outbox: MakeOutbox
) -> None:
    # An operator's open transaction that marked a row delivered by hand holds the count
    # it added to; a drain delivering in the same outbox and minute goes on. The drain's
    # connection is one whose pid has the operator's remainder modulo 16, the counts'
    # shard before 0028.
    outbox = make_outbox("shared")
    await enqueue(database, outbox, "by_hand", "a", "b")
    dsn = asyncpg_dsn(database_url)
    operator = await asyncpg.connect(dsn)
    connections = [operator]
    try:
        remainder = await operator.fetchval("SELECT pg_backend_pid() % 16")
        while True:
            drain = await asyncpg.connect(dsn)
            connections.append(drain)
            if await drain.fetchval("SELECT pg_backend_pid() % 16") == remainder:
                break
        await prepare_connection(drain)
        async with operator.transaction():
            await operator.execute(
                "UPDATE outbox_messages SET status = 'delivered', delivered_at = $1"
                " WHERE key = 'by_hand'",
                lease_now(clock),
            )
            report = await asyncio.wait_for(outbox.drain_on(drain), 10)
        assert report.delivered == 2
    finally:
        for connection in connections:
            await connection.close()


def test_a_delivery_committed_while_the_counts_migration_runs_is_counted(
    empty_database_url: str,
) -> None:
    # A rolling deploy: a drain of the release before delivers a row, its transaction
    # still open, while the new release migrates past 0027.
    migrate(empty_database_url)
    command.downgrade(alembic_config(empty_database_url), "0026")
    _pending(empty_database_url, "x")
    with psycopg.connect(empty_database_url) as drain:
        drain.execute(_DELIVER, ("x",))
        _commit_while(empty_database_url, drain, lambda: migrate(empty_database_url))
    assert _counted_live(empty_database_url) == 1


def test_a_delivery_committed_while_the_counts_migration_is_undone_is_counted(
    empty_database_url: str,
) -> None:
    # A rollback of a release: a drain of the newer one delivers a second row in a
    # minute its backend already counted one in, its transaction still open, while the
    # release before migrates down past 0028.
    migrate(empty_database_url)
    _pending(empty_database_url, "x", "y")
    config = alembic_config(empty_database_url)
    with psycopg.connect(empty_database_url) as drain:
        drain.execute(_DELIVER, ("x",))
        drain.commit()
        drain.execute(_DELIVER, ("y",))
        _commit_while(empty_database_url, drain, lambda: command.downgrade(config, "0027"))
    assert _counted_live(empty_database_url) == 2


_DELIVER = "UPDATE outbox_messages SET status = 'delivered', delivered_at = now() WHERE key = %s"


def _pending(url: str, *keys: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for key in keys:
            conn.execute(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at)"
                " VALUES ('live', %s, '{}', 'pending', 0, now(), now(), now())",
                (key,),
            )


def _counted_live(url: str) -> int | None:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT sum(delivered) FROM outbox_delivered_minutes WHERE outbox = 'live'"
        ).fetchone()
    return None if row is None else row[0]


def _commit_while(url: str, drain: psycopg.Connection[Any], migration: Callable[[], None]) -> None:
    """Run ``migration`` in a thread and commit ``drain``'s open transaction once a
    backend waits on a lock (the migration, on the drain's), then wait for it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        migrating = pool.submit(migration)
        with psycopg.connect(url, autocommit=True) as watch:
            while not migrating.done():
                waiting = watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                watch.execute("SELECT pg_sleep(0.02)")
        drain.commit()
        migrating.result(timeout=60)
