"""The outbox counts operators read (API, page, CLI, /metrics: outboxes.outbox_summary)
cost what the live rows cost: pending and stuck rows, and a one-hour window of
deliveries, never every delivered row kept."""

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
    " SELECT 'mails', 'old-' || n, '{}', 'delivered', 1, t, t, t, t"
    " FROM (SELECT n, now() - interval '3 days' + make_interval(secs => n) AS t"
    "       FROM generate_series(1, 20000) n) s"
)


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """Rows the plan's scans of ``table`` read: returned plus removed by a filter."""
    own = 0
    if plan.get("Relation Name") == table:
        own = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan.get(
            "Actual Loops", 1
        )
    return own + sum(_rows_read(child, table) for child in plan.get("Plans", []))


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
        await conn.execute(_FILL)
        await conn.execute(text("ANALYZE outbox_messages"))
    statement = outboxes._OUTBOXES.text
    async with database.engine.connect() as conn:
        explained = await conn.execute(
            text(f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}"), {"lease_now": None}
        )
        raw = explained.scalar_one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    # Three live rows and one recent delivery, each read at most once per lookup; the
    # 20,000 older deliveries never.
    assert _rows_read(plan, "outbox_messages") < 20, plan
