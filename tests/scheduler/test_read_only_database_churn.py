"""A leader that cannot register its jobs backs off; it does not re-promote in a hot loop.

``ALTER DATABASE ... SET default_transaction_read_only = on`` (a maintenance freeze)
makes the leader's job upsert fail. The supervisor steps down and at once takes the
key again, with no delay: a connect, four checks, a lock and a failed upsert, over
and over, as fast as the server answers.
"""

from __future__ import annotations

import asyncio

import psycopg

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import StartScheduler


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_leader_that_cannot_register_its_jobs_backs_off(
    start_scheduler: StartScheduler, database: Database, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()
        assert name is not None
        admin.execute(f'ALTER DATABASE "{name[0]}" SET default_transaction_read_only = on')
    await database.engine.dispose()
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="frozen")(_noop)
    promotions: list[str] = []
    scheduler.observe(on_role=lambda role: promotions.append(role) if role == "leader" else None)
    # A fake clock: any backoff waits on it, so only a loop without one promotes again.
    await start_scheduler(scheduler, clock=FakeClock())
    await asyncio.sleep(2)
    assert len(promotions) <= 2, f"{len(promotions)} promotions in 2 s without a backoff"
