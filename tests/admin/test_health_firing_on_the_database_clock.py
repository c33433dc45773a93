"""/health/scheduler's "firing" must not depend on the leader host's clock: a leader
whose tick has written no heartbeat for longer than a lease is not firing, whatever
its clock said at promotion."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx
from sqlalchemy import text

from app.db import Database
from app.main import create_app
from app.scheduler import JobContext, Scheduler, every
from app.settings import Settings

from ..conftest import SkewedClock, StartScheduler

LEASE_SECONDS = 6  # the test settings' and config's


async def _noop(ctx: JobContext) -> None:
    return None


async def _refuse_heartbeats(database: Database) -> None:
    """Every tick's heartbeat fails (a stuck tick); a promotion (which moves the term)
    still records its leadership."""
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                """
                CREATE FUNCTION refuse_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN RAISE EXCEPTION 'heartbeat refused by the test'; END $$
                """
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_heartbeat BEFORE UPDATE ON scheduler_leadership"
                " FOR EACH ROW WHEN (OLD.term = NEW.term) EXECUTE FUNCTION refuse_heartbeat()"
            )
        )


async def _db_seconds_pass(database: Database, seconds: float) -> None:
    async with database.engine.connect() as conn:
        start = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
    async with asyncio.timeout(seconds + 10):
        while True:
            async with database.engine.connect() as conn:
                now = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()
            if (now - start).total_seconds() > seconds:
                return
            await asyncio.sleep(0.2)


async def test_a_leader_whose_clock_runs_ahead_and_whose_tick_is_stuck_is_not_firing(
    start_scheduler: StartScheduler, settings: Settings, database: Database
) -> None:
    await _refuse_heartbeats(database)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(_noop)
    supervisor = await start_scheduler(scheduler, clock=SkewedClock(timedelta(hours=1)))
    await supervisor.wait_until_firing()
    await _db_seconds_pass(database, LEASE_SECONDS + 2)
    app = create_app(settings, None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            health = (await client.get("/health/scheduler")).json()
    assert health["firing"] is False, health
