"""An enqueue racing the prune of its key's delivered row is a new message: the key
deduplicates only while its row is kept, so once retention deleted it (between the
insert that met it and the read of the row that had the key) the enqueue writes the
message again, rather than fail with a driver's NoResultFound inside the caller's
transaction."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.util import await_only

from app.db import Database, asyncpg_dsn
from app.outbox import Message, Outbox
from app.outbox.retention import prune_delivered_batch

from .conftest import DAY, History

_ROWS = text("SELECT id, status FROM outbox_messages WHERE outbox = 'mails' AND key = 'k'")


async def _deliver(message: Message) -> None:
    """A receiver never called: nothing is drained here."""


@pytest.fixture
def pruned_after_the_insert(database: Database) -> Iterator[None]:
    """A retention batch of outbox 'mails' (OUTBOX_DELIVERED_DAYS 7), committed by its
    own session right after the enqueue's insert, before the enqueue's next statement."""
    fired = False

    async def prune() -> None:
        async with database.sessions() as session:
            await prune_delivered_batch(session, outbox="mails", days=7, batch=1000)

    def after_statement(*args: Any) -> None:
        nonlocal fired
        if fired or not args[2].lstrip().startswith("WITH inserted AS"):
            return
        fired = True
        await_only(prune())

    target = database.engine.sync_engine
    event.listen(target, "after_cursor_execute", after_statement)
    try:
        yield
    finally:
        event.remove(target, "after_cursor_execute", after_statement)


@pytest.mark.usefixtures("pruned_after_the_insert")
async def test_an_enqueue_whose_keys_row_is_pruned_meanwhile_writes_a_new_message(
    database: Database, database_url: str, history: History
) -> None:
    await history.message("mails", "k", age=8 * DAY)
    outbox = Outbox("mails", _deliver)
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database_url))
    async with database.sessions() as session, session.begin():
        enqueued = await outbox.enqueue(session, {"n": 1}, key="k")
    assert enqueued.created
    async with database.engine.connect() as conn:
        assert [tuple(row) for row in await conn.execute(_ROWS)] == [(enqueued.id, "pending")]
