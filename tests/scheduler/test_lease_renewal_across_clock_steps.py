"""A running lease is renewed every third of the lease whatever the host's wall clock
does: a clock stepped back (NTP) while a renewal is under way does not stretch the
wait for the next renewal by the size of the step, so the lease never runs out while
the body runs in a living process (and no other leader starts the job beside it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db import Database
from app.scheduler import JobContext, Scheduler, SystemClock, every
from app.scheduler.clock import lease_clock
from app.scheduler.runner import Runner
from app.scheduler.store import JobStore
from app.testing.claims import claim_leader

from ..conftest import SkewedClock, statement_waits_on_a_lock
from .conftest import eventually

UTC_ZONE = ZoneInfo("UTC")
LEASE_SECONDS = 3.0


async def _lease_left(engine: AsyncEngine, job_id: str) -> float | None:
    """Seconds left on the running lease of the job's run (held on its run row), on the
    database's clock."""
    async with engine.connect() as conn:
        left = await conn.execute(
            text(
                "SELECT extract(epoch FROM r.running_until - clock_timestamp())::float"
                " FROM scheduler_jobs j JOIN scheduler_runs r ON r.id = j.running_run_id"
                " WHERE j.id = :id"
            ),
            {"id": job_id},
        )
        value = left.scalar_one_or_none()
        return None if value is None else float(value)


@asynccontextmanager
async def _run_row_held(engine: AsyncEngine, run_id: int) -> AsyncIterator[AsyncConnection]:
    """Another transaction holds the run's row (where its lease is renewed) until it
    rolls back."""
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT 1 FROM scheduler_runs WHERE id = :id FOR UPDATE"), {"id": run_id}
        )
        try:
            yield conn
        finally:
            await conn.rollback()


async def test_a_clock_stepped_back_during_a_renewal_lets_no_running_lease_run_out(
    database: Database, engine: AsyncEngine
) -> None:
    host_clock = SkewedClock(timedelta(0))
    runner = Runner(
        JobStore(database.engine, pid=1, host="test", lease_clock=lease_clock(host_clock)),
        clock=host_clock,
        zone=UTC_ZONE,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=LEASE_SECONDS,
    )
    entered, release = asyncio.Event(), asyncio.Event()
    scheduler = Scheduler()

    @scheduler.job(every(hours=1), id="long")
    async def long(ctx: JobContext) -> None:
        entered.set()
        await release.wait()

    spec = scheduler.jobs["long"]
    rows = await runner.store.register_leader_jobs([spec], SystemClock().now(), UTC_ZONE)
    claim = await claim_leader(runner, spec, rows["long"].next_run_at, None)
    assert claim is not None and claim.runs
    body = runner.start(spec, claim)
    try:
        await asyncio.wait_for(entered.wait(), 10)
        # A renewal takes a moment (here: the run row is busy for it, under its second
        # of patience), and NTP steps the host's clock back two minutes meanwhile.
        async with _run_row_held(engine, claim.run_id) as holder:
            await eventually(
                lambda: statement_waits_on_a_lock(engine, "running_until"),
                what="a renewal under way",
            )
            host_clock.skew = timedelta(minutes=-2)
            await holder.rollback()
        # Three leases' time: the lease must hold throughout, renewed every third.
        deadline = asyncio.get_running_loop().time() + 3 * LEASE_SECONDS
        while asyncio.get_running_loop().time() < deadline:
            left = await _lease_left(engine, "long")
            assert left is not None and left > 0, (
                f"the running lease of 'long' ran out (left: {left} s) while its body runs"
            )
            await asyncio.sleep(0.1)
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(body, return_exceptions=True), 30)
