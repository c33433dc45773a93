"""The outbox counts operators read (API, page, CLI, /metrics: outboxes.outbox_summary)
cost what the live rows cost: pending and stuck rows, and the last hour's deliveries
from counts kept as rows are delivered, never a delivered row, kept or recent."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text

from app.db import Database
from app.operations import outboxes

from .conftest import DAY, History

_FILL = text(
    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
    " created_at, updated_at, delivered_at)"
    " SELECT 'mails', :prefix || n, '{}', 'delivered', 1, t, t, t, t"
    " FROM (SELECT n, now() + make_interval(secs => n / 10.0 - CAST(:ago AS double precision))"
    "       AS t FROM generate_series(1, 20000) n) s"
)


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """Rows the plan's scans of ``table`` read: returned plus removed by a filter."""
    own = 0
    if plan.get("Relation Name") == table:
        own = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan.get(
            "Actual Loops", 1
        )
    return own + sum(_rows_read(child, table) for child in plan.get("Plans", []))


async def _plan(database: Database) -> dict[str, Any]:
    """The summary statement's plan, as it ran."""
    statement = outboxes._OUTBOXES.text
    async with database.engine.connect() as conn:
        explained = await conn.execute(
            text(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"), {"lease_now": None}
        )
        raw = explained.scalar_one()
    plan: dict[str, Any] = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return plan


async def test_delivered_counts_are_the_last_hours_deliveries(
    database: Database, history: History
) -> None:
    await history.message("mails", "recent", age=600)
    await history.message("mails", "earlier", age=2 * 3600)
    await history.message("mails", "p", age=DAY, status="pending")
    [entry] = await outboxes.outbox_summary(database.engine)
    assert entry["counts"] == {"pending": 1, "scheduled": 0, "delivered": 1, "stuck": 0}
    assert entry["delivered_window_seconds"] == outboxes.DELIVERED_WINDOW_SECONDS


async def test_the_outbox_counts_read_no_delivered_row_outside_the_window(
    database: Database, history: History
) -> None:
    await history.message("mails", "p", age=60, status="pending")
    await history.message("mails", "s", age=60, status="stuck")
    await history.message("mails", "recent", age=60)
    async with database.engine.begin() as conn:
        await conn.execute(_FILL, {"prefix": "old-", "ago": 3 * DAY})
        await conn.execute(text("ANALYZE outbox_messages"))
    assert _rows_read(await _plan(database), "outbox_messages") < 20


async def test_the_outbox_counts_read_no_row_of_the_last_hours_deliveries(
    database: Database, history: History
) -> None:
    # A busy outbox's last hour holds as many rows as it delivered: reading them cost
    # what the history costs (500,000 in 50 minutes: 86 ms against 1.2 ms empty).
    await history.message("mails", "p", age=60, status="pending")
    async with database.engine.begin() as conn:
        await conn.execute(_FILL, {"prefix": "recent-", "ago": 40 * 60})
        await conn.execute(text("ANALYZE outbox_messages"))
    [entry] = await outboxes.outbox_summary(database.engine)
    assert entry["counts"]["delivered"] == 20000
    assert _rows_read(await _plan(database), "outbox_messages") < 20
