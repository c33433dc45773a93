"""A busy row breaks no other guarantee: a job row that another transaction holds (an
operator's psql session left open on ``SELECT ... FOR UPDATE``) while the job's body
runs in one process, for longer than the running lease, does not let another leader
start the job beside that body once the row is free. The body's process is alive and
renewing all along; only the held row kept its renewals out."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.runner import Due, Runner
from app.scheduler.store import JobStore
from app.testing.claims import claim_leader

from .conftest import row_held

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")
LEASE_SECONDS = 6.0


def _runner(database: Database, clock: FakeClock, pid: int) -> Runner:
    return Runner(
        JobStore(database.engine, pid=pid, host=f"host-{pid}", lease_clock=clock),
        clock=clock,
        zone=UTC_ZONE,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=LEASE_SECONDS,
    )


async def test_a_job_whose_row_was_held_past_its_lease_does_not_start_beside_its_running_body(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    entered, release = asyncio.Event(), asyncio.Event()
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="report", first_run=0)
    async def report(ctx: JobContext) -> None:
        entered.set()
        await release.wait()

    spec = scheduler.jobs["report"]
    owner = _runner(database, clock, pid=1)
    rows = await owner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    claim = await claim_leader(owner, spec, rows["report"].next_run_at, None)
    assert claim is not None and claim.runs
    body = owner.start(spec, claim)
    await asyncio.wait_for(entered.wait(), 10)
    # A new leader (after a handover) will claim the job's next slot.
    successor = _runner(database, clock, pid=2)
    try:
        async with row_held(engine, "report") as holder:
            # The owner's renewer tries every period (and, should a try fail, again
            # within seconds), the job row held all along. Past a lease of that:
            while clock.now() < T0 + timedelta(seconds=LEASE_SECONDS + 1):
                # The renewer (the only sleeper) is parked between its tries.
                await clock.wait_for_sleepers(1, timeout=10)
                clock.advance(1)
            await clock.wait_for_sleepers(1, timeout=10)
            await holder.rollback()
        # The row is free, and the new leader claims the job's next slot before the
        # owner's renewer tries again (it does so within seconds; a claim of a due slot
        # comes within a tick).
        [successor_claim] = await successor.claim_many([Due(spec, claim.next_slot)], None)
        assert not body.done(), "the first body still runs"
        assert successor_claim is not None and not isinstance(successor_claim, Exception)
        assert not successor_claim.runs, (
            f"a second run of 'report' started ({successor_claim}) while the first body, "
            "alive and renewing in its process, still runs"
        )
    finally:
        release.set()
        await asyncio.wait_for(asyncio.gather(body, return_exceptions=True), 30)
