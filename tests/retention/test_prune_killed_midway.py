"""A prune killed mid-way (kill -9 of `python -m app prune` while it waits to delete
its next batch) has removed whole batches of the oldest prunable runs and nothing
else; the next prune removes the rest."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db import Database
from app.retention import BATCH_SIZE, RetentionPolicy, prune

from .conftest import History

OLD = 60_000
KEEP = 3
_FILL = text(
    "INSERT INTO scheduler_runs (schedule, job_id, scope, slot, started_at, finished_at,"
    " status, lateness_ms, pid, host)"
    " SELECT 'default', 'busy', 'leader', t, t, t, 'ok', 0, 1, 'h'"
    " FROM (SELECT now() - interval '90 days' + make_interval(secs => n) AS t"
    "       FROM generate_series(1, :count) n) s"
)
_COUNT = text("SELECT count(*) FROM scheduler_runs")
_PRUNABLE_LEFT = text("SELECT min(id), count(*) FROM scheduler_runs WHERE id <= :last")
# The prune's next DELETE, waiting for the test's table lock.
_WAITING_DELETE = text(
    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    " AND query LIKE '%DELETE FROM scheduler_runs%'"
)


async def _count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count: int = (await conn.execute(_COUNT)).scalar_one()
    return count


async def test_a_prune_killed_mid_way_removed_whole_batches_of_the_oldest_and_resumes(
    database: Database, database_url: str, history: History
) -> None:
    # The job's row and its oldest run; then the fill, one run a second after it, with
    # the ids that follow (one statement), so the oldest runs are the lowest ids.
    first = await history.run("busy", age=120 * 86400)
    async with database.engine.begin() as conn:
        await conn.execute(_FILL, {"count": OLD})
    last = first + OLD
    kept = {await history.run("busy", age=60 - n) for n in range(KEEP)}
    total = await _count(database.engine)
    prunable = total - KEEP

    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        "prune",
        env={**os.environ, "DATABASE_URL": database_url, "RUN_HISTORY_KEEP": str(KEEP)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        async with asyncio.timeout(60):
            while await _count(database.engine) == total:
                assert process.returncode is None, "the prune ended before it deleted anything"
                await asyncio.sleep(0.02)
        # Hold the table: the batch under way commits, the next one waits here.
        async with database.engine.connect() as lock:
            await lock.execute(text("BEGIN"))
            await lock.execute(text("LOCK TABLE scheduler_runs IN SHARE MODE"))
            async with asyncio.timeout(30), database.engine.connect() as conn:
                while (await conn.execute(_WAITING_DELETE)).scalar_one() == 0:
                    await asyncio.sleep(0.02)
            process.send_signal(signal.SIGKILL)
            async with asyncio.timeout(30):
                await process.wait()
            await lock.execute(text("ROLLBACK"))
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

    left = await _count(database.engine)
    gone = total - left
    # Mid-way; only whole batches went (the killed one was rolled back), the oldest.
    assert 0 < gone < prunable
    assert gone % BATCH_SIZE == 0
    async with database.engine.connect() as conn:
        lowest, count = (await conn.execute(_PRUNABLE_LEFT, {"last": last})).one()
    assert (lowest, count) == (first + gone, prunable - gone)
    assert kept <= await history.run_ids()

    async with AsyncSession(database.engine) as session:
        policy = RetentionPolicy(
            run_history_days=30, run_history_keep=KEEP, outbox_delivered_days=7
        )
        report = await prune(session, "default", policy)
    assert report.runs == prunable - gone
    assert await history.run_ids() == kept
