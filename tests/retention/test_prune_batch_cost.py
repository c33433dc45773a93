"""A retention batch reads what it deletes, not the history keep-last holds: rare jobs
keep their last runs however old, and those runs sit where the oldest prunable ones are
looked for, batch after batch."""

from __future__ import annotations

from typing import Any

from sqlalchemy import text

from app.db import Database
from app.scheduler.store import retention

RARE_JOBS = 200
KEEP = 20
BATCH = 200

_JOBS = text(
    "INSERT INTO scheduler_jobs (schedule, id, name, trigger, next_run_at)"
    " SELECT 'default', 'rare_' || n, 'rare', 'every 60s', now()"
    " FROM generate_series(1, :jobs) n"
    " UNION ALL SELECT 'default', 'busy', 'busy', 'every 1s', now()"
)
# Each rare job's last KEEP runs, a year old: all kept.
_RARE_RUNS = text(
    "INSERT INTO scheduler_runs (schedule, job_id, scope, slot, started_at, finished_at,"
    " status, lateness_ms, pid, host)"
    " SELECT 'default', 'rare_' || j, 'leader', t, t, t, 'ok', 0, 1, 'h'"
    " FROM generate_series(1, :keep) k, generate_series(1, :jobs) j,"
    " LATERAL (SELECT now() - interval '400 days' + make_interval(days => k) AS t) s"
)
# A busy job's runs of 40 days ago, prunable, after them.
_BUSY_RUNS = text(
    "INSERT INTO scheduler_runs (schedule, job_id, scope, slot, started_at, finished_at,"
    " status, lateness_ms, pid, host)"
    " SELECT 'default', 'busy', 'leader', t, t, t, 'ok', 0, 1, 'h'"
    " FROM generate_series(1, 5000) k,"
    " LATERAL (SELECT now() - interval '40 days' + make_interval(secs => k) AS t) s"
)


def _runs_read(node: dict[str, Any]) -> int:
    """Rows the plan's scans of scheduler_runs, and of what a CTE kept of it, returned or
    threw away, over all their loops."""
    own = 0
    if node.get("Relation Name") == "scheduler_runs" or node["Node Type"] == "CTE Scan":
        read = node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
        own = int(read * node.get("Actual Loops", 1))
    return own + sum(_runs_read(child) for child in node.get("Plans", []))


async def _runs_a_batch_reads(database: Database) -> int:
    """Rows of scheduler_runs one batch (30 days, keep KEEP) reads, once the history is
    analyzed as autovacuum would; the batch is rolled back."""
    async with database.engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(text("VACUUM ANALYZE scheduler_runs"))
    params = {"schedule": "default", "days": 30, "keep": KEEP, "batch": BATCH, "lease_now": None}
    async with database.engine.connect() as conn:
        explained = text("EXPLAIN (ANALYZE, FORMAT JSON) " + retention._PRUNE_BATCH.text)
        [[plan]] = (await conn.execute(explained, params)).all()
        await conn.rollback()
    [root] = plan
    return _runs_read(root["Plan"])


async def test_a_retention_batch_does_not_reread_the_runs_keep_last_holds(
    database: Database,
) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(_JOBS, {"jobs": RARE_JOBS})
        await conn.execute(_RARE_RUNS, {"jobs": RARE_JOBS, "keep": KEEP})
        await conn.execute(_BUSY_RUNS)
    runs_read = await _runs_a_batch_reads(database)
    # Finding each job's keep-last bound reads its KEEP newest entries; the batch itself
    # should read about what it deletes. Before, each candidate row looked its job up
    # among every job, and the rare jobs' kept rows were read again each batch.
    budget = 3 * (RARE_JOBS * KEEP + BATCH + RARE_JOBS)
    assert runs_read <= budget


_BUSY_JOBS = text(
    "INSERT INTO scheduler_jobs (schedule, id, name, trigger, next_run_at)"
    " SELECT 'default', 'busy_' || n, 'busy', 'every 1s', now() FROM generate_series(1, :jobs) n"
)
# Each busy job's runs of 40 days ago, prunable, interleaved in time as jobs run.
_MANY_BUSY_RUNS = text(
    "INSERT INTO scheduler_runs (schedule, job_id, scope, slot, started_at, finished_at,"
    " status, lateness_ms, pid, host)"
    " SELECT 'default', 'busy_' || (k % :jobs + 1), 'leader', t, t, t, 'ok', 0, 1, 'h'"
    " FROM generate_series(1, :runs) k,"
    " LATERAL (SELECT now() - interval '40 days' + make_interval(secs => k) AS t) s"
)


async def test_a_retention_batch_reads_about_what_it_deletes_with_many_busy_jobs(
    database: Database,
) -> None:
    jobs = 50
    async with database.engine.begin() as conn:
        await conn.execute(_BUSY_JOBS, {"jobs": jobs})
        await conn.execute(_MANY_BUSY_RUNS, {"jobs": jobs, "runs": jobs * 2 * BATCH})
    runs_read = await _runs_a_batch_reads(database)
    # A batch's worth from each job, sorted by age, read fifty batches for one.
    assert runs_read <= 3 * (BATCH + KEEP + jobs)
