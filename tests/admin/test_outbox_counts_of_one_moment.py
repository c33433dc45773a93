"""The outbox counts operators read (API, page, CLI, /metrics: outboxes.outbox_summary)
are the counts of one moment: a message enqueued while they are read is counted whole
or not at all, never subtracted from one status without being added to another, and
an outbox that appears meanwhile does not fail the read."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.util import await_only

from app.db import Database
from app.operations.outboxes import outbox_summary

_CLAIM_NAME = text("INSERT INTO outbox_schedules (outbox, schedule) VALUES (:outbox, 'default')")
# Delayed messages an hour out: scheduled, not pending.
_SCHEDULED = text(
    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
    " deliver_at, created_at, updated_at)"
    " SELECT :outbox, 'k' || n, '{}', 'pending', 0, t, t, now(), now()"
    " FROM generate_series(1, 3) n, (SELECT now() + interval '1 hour' AS t) s"
)


@pytest.fixture
def enqueued_during_the_read(database: Database) -> Iterator[list[str]]:
    """Outbox names (the test appends them) that get three scheduled messages,
    committed by another connection, right after the first statement of a read that
    counts outbox_messages."""
    outboxes: list[str] = []
    fired = False

    async def enqueue() -> None:
        async with database.engine.begin() as conn:
            for outbox in outboxes:
                await conn.execute(_SCHEDULED, {"outbox": outbox})

    def after_statement(*args: Any) -> None:
        nonlocal fired
        statement: str = args[2]
        if fired or "FROM outbox_messages" not in statement:
            return
        fired = True
        # Within the reading connection's greenlet: the other connection's commit lands
        # between this statement and the next of the same read.
        await_only(enqueue())

    target = database.engine.sync_engine
    event.listen(target, "after_cursor_execute", after_statement)
    try:
        yield outboxes
    finally:
        event.remove(target, "after_cursor_execute", after_statement)


async def test_no_outbox_count_goes_negative_when_messages_are_enqueued_during_the_read(
    database: Database, enqueued_during_the_read: list[str]
) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(_CLAIM_NAME, {"outbox": "mails"})
    enqueued_during_the_read.append("mails")
    [entry] = await outbox_summary(database.engine)
    assert entry["counts"]["pending"] == 0
    assert entry["counts"]["scheduled"] in (0, 3)


async def test_an_outbox_whose_first_messages_come_during_the_read_does_not_fail_it(
    database: Database, enqueued_during_the_read: list[str]
) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(_CLAIM_NAME, {"outbox": "mails"})
    enqueued_during_the_read.append("fresh")
    summary = await outbox_summary(database.engine)
    counts = {entry["name"]: entry["counts"] for entry in summary}
    assert counts["mails"]["pending"] == 0
    assert counts.get("fresh", {"pending": 0})["pending"] == 0
