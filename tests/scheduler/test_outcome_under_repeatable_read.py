"""A run's outcome is recorded under any default isolation level the database sets.

With ``default_transaction_isolation = 'repeatable read'`` (or serializable) on the
database, the finish transaction takes its snapshot at its first statement; any update
of the job row committed after that (another leader's skipped_overlap claim, the lease
renewal, an operator's pause) makes its UPDATE of the job row fail with a serialization
error, and the outcome is never recorded.
"""

from __future__ import annotations

import asyncio

import psycopg
from sqlalchemy import text

from app.db import Database
from app.scheduler import JobContext, Scheduler, every
from app.testing import run_job

from .conftest import eventually


async def test_a_runs_outcome_is_recorded_under_a_repeatable_read_default(
    database: Database, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()
        assert name is not None
        admin.execute(
            f"ALTER DATABASE \"{name[0]}\" SET default_transaction_isolation = 'repeatable read'"
        )
    await database.engine.dispose()
    body_may_end = asyncio.Event()

    async def waits(ctx: JobContext) -> None:
        await body_may_end.wait()

    scheduler = Scheduler()
    scheduler.job(every(minutes=5), id="rr_job")(waits)
    running = asyncio.create_task(run_job(scheduler, "rr_job", database=database))

    async def started() -> bool:
        async with database.engine.connect() as conn:
            status = await conn.execute(text("SELECT status FROM scheduler_runs"))
            return status.scalar_one_or_none() == "running"

    await eventually(started, what="the run to start")
    with psycopg.connect(database_url) as other:
        # Another writer of the job row, in flight while the body ends: e.g. an
        # operator's pause, or another leader's claim of the next slot.
        other.execute("UPDATE scheduler_jobs SET updated_at = now() WHERE id = 'rr_job'")
        body_may_end.set()

        async def finish_waits_for_the_row() -> bool:
            async with database.engine.connect() as conn:
                waiting = await conn.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                )
                return bool(waiting.scalar_one())

        await eventually(finish_waits_for_the_row, what="the finish to wait for the row")
        other.commit()
    record = await running
    assert record.status == "ok", f"the run stayed {record.status!r}"
