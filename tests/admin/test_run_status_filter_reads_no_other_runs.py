"""A job's run history filtered by status (the admin API's and page's ``?status=``, the
CLI's ``jobs runs --status``) reads the runs of that status only: its cost is the page
it answers, not the job's history. Unfiltered, ``?status=error`` on a job with a
month of 1 s runs and no error read every one of them (a sequential scan)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import event, text

from app.db import Database
from app.operations.runs import job_runs

_HISTORY = text(
    """
    WITH job AS (
        INSERT INTO scheduler_jobs (schedule, id, name, trigger, next_run_at)
        VALUES ('default', 'busy', 'busy', 'every 1s', now() + interval '1 hour')
    )
    INSERT INTO scheduler_runs (schedule, job_id, scope, slot, started_at, finished_at,
        status, lateness_ms, pid, host)
    SELECT 'default', 'busy', 'leader', t, t, t,
        CASE WHEN n % 5000 = 0 THEN 'error' ELSE 'ok' END, 3, 1, 'h'
    FROM (SELECT n, now() - make_interval(secs => n) AS t
          FROM generate_series(1, 20000) n) s
    """
)


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """Rows the plan's scans of ``table`` read: returned plus removed by a filter."""
    own = 0
    if plan.get("Relation Name") == table:
        own = (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan.get(
            "Actual Loops", 1
        )
    return own + sum(_rows_read(child, table) for child in plan.get("Plans", []))


async def test_runs_filtered_by_a_status_read_only_runs_of_that_status(
    database: Database,
) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(_HISTORY)
        await conn.execute(text("ANALYZE scheduler_runs"))
    sent: list[tuple[str, Any]] = []

    def record(*args: Any) -> None:
        if "FROM scheduler_runs r" in args[2]:
            sent.append((args[2], args[3]))

    event.listen(database.engine.sync_engine, "before_cursor_execute", record)
    try:
        errors = await job_runs(database.engine, "busy", status="error", limit=50)
        none = await job_runs(database.engine, "busy", status="abandoned", limit=50)
    finally:
        event.remove(database.engine.sync_engine, "before_cursor_execute", record)
    assert (len(errors), len(none)) == (4, 0)
    statement, parameters = sent[-1]
    async with database.engine.connect() as conn:
        explained = await conn.exec_driver_sql(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {statement}", parameters
        )
        raw = explained.scalar_one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    # No abandoned run: nothing to read, whatever the job's 20,000 runs.
    assert _rows_read(plan, "scheduler_runs") == 0, plan
