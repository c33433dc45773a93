"""A busy row delays nothing else, a per-worker job's row too: the row of a per-worker
job whose run's worker died, held by another transaction (an operator's psql session
left open on ``SELECT ... FOR UPDATE``) with PostgreSQL's defaults (no lock_timeout),
holds up no reap of the leader's tick: the reap passes that job by (its dead run is
reaped once the row is free) and reaps every other job's."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.store import JobStore

from .conftest import row_held, runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE_SECONDS = 6.0


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_held_per_worker_job_row_holds_up_no_reap_of_other_jobs(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    for job_id in ("held", "free"):
        scheduler.job(every(minutes=1), id=job_id, leader_only=False)(_noop)
    # A worker started a run of each job, then died: no one renews their leases.
    worker = JobStore(engine, pid=1, host="worker", lease_clock=clock)
    specs = [scheduler.jobs["held"], scheduler.jobs["free"]]
    await worker.register_replica_jobs(specs, T0, ZoneInfo("UTC"))
    for spec in specs:
        await worker.start_replica_run(spec, T0, T0, lease_seconds=LEASE_SECONDS)
    clock.advance(LEASE_SECONDS + 1)
    leader = JobStore(engine, pid=2, host="leader", lease_clock=clock)
    async with row_held(engine, "held") as holder:
        try:
            reaped = await asyncio.wait_for(leader.reap(clock.now()), 10)
        except TimeoutError:
            raise AssertionError("the reap waited on the held per-worker job row") from None
        assert reaped == ["free"]
        assert await runs(engine, "held") == [("running", T0)]
        await holder.rollback()
    # The row is free: the next reap takes the held job's dead run.
    assert await leader.reap(clock.now()) == ["held"]
    assert await runs(engine, "held") == [("abandoned", T0)]
