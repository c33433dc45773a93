"""A drain pass reads the rows it drains, not the table: what a pass costs the database
grows with the rows it delivers, whatever else the outbox table holds (the delivered
rows retention keeps for days, other outboxes' rows).

An outcome write that reads the whole table (a sequential scan per batch of outcomes)
or reads its batch once per row of it makes the drain's throughput fall as the table
grows; on a table of 10,000 rows it cost a drain a fifth of its rows a second or more
(bench/outbox.py)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import text

from app.db import Database
from app.outbox import Message

from .conftest import MakeOutbox, enqueue

_KEPT = 20_000
_DUE = 200
# A claim finds its rows and updates them; an outcome write locks them and updates
# them: about four reads a row. Reading the table costs _KEPT reads a write; reading
# the batch again for each row of it, up to a batch's worth a row.
_READS_PER_ROW = 6

# Delivered rows of another outbox, as retention keeps them, then fresh statistics: the
# planner knows the table is large.
_KEEP = text(
    """
    INSERT INTO outbox_messages
        (outbox, key, payload, status, attempts, next_attempt_at, delivered_at,
        created_at, updated_at)
    SELECT 'archive', 'k' || n, '{}'::jsonb, 'delivered', 1, now(), now(), now(), now()
    FROM generate_series(1, :rows) AS n
    """
)

_ROWS_READ = (
    "SELECT seq_tup_read + COALESCE(idx_tup_fetch, 0) FROM pg_stat_user_tables"
    " WHERE relname = 'outbox_messages'"
)


async def _rows_read(connection: Any) -> int:
    """Rows of outbox_messages read by scans so far, with what ``connection``'s backend
    read reported first: a backend reports its counts as it goes idle, at most once a
    second unless told to."""
    await connection.execute("SELECT pg_stat_force_next_flush()")
    return int(await connection.fetchval(_ROWS_READ))


@pytest.mark.parametrize("outcome", ["delivered", "retried"])
async def test_a_pass_reads_a_few_rows_per_row_it_drains_whatever_the_table_holds(
    make_outbox: MakeOutbox, database: Database, drain_connection: Any, outcome: str
) -> None:
    async def receive(message: Message) -> None:
        if outcome == "retried":
            raise ConnectionError("receiver refused")

    async with database.engine.begin() as conn:
        await conn.execute(_KEEP, {"rows": _KEPT})
        await conn.execute(text("ANALYZE outbox_messages"))
    outbox = make_outbox(deliver=receive, batch_size=50, concurrency=10)
    await enqueue(database, outbox, *(f"k{n}" for n in range(_DUE)))
    before = await _rows_read(drain_connection)

    report = await outbox.drain_on(drain_connection)

    read = await _rows_read(drain_connection) - before
    assert getattr(report, outcome) == _DUE
    assert read <= _READS_PER_ROW * _DUE, f"{read} rows read to drain {_DUE}"
