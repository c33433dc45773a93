"""Run now is refused only while a body really runs: a dead owner's run must not block it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncEngine

from app.operations.jobs import run_job_now
from app.scheduler import FakeClock, JobContext, Scheduler, cron
from app.scheduler.store import JobStore
from app.testing.claims import claim_slot

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def _yearly(ctx: JobContext) -> None:
    return None


async def test_run_now_is_accepted_once_a_killed_owners_running_lease_ran_out(
    engine: AsyncEngine,
) -> None:
    scheduler = Scheduler()
    scheduler.job(cron("0 0 1 1 *", tz="UTC"), id="yearly")(_yearly)
    spec = scheduler.jobs["yearly"]
    clock = FakeClock(T0 - timedelta(days=1))
    store = JobStore(engine, pid=4242, host="gone", lease_clock=clock)
    rows = await store.register_leader_jobs([spec], clock.now(), ZoneInfo("UTC"))
    due = rows["yearly"].next_run_at
    clock.set(due)
    # The owner claims its slot, starts the body and is killed (kill -9): nothing ever
    # records the outcome or clears the lease; the lease runs out on its own.
    claimed = await claim_slot(
        store,
        spec,
        due=due,
        next_slot=spec.trigger.next_after(due, ZoneInfo("UTC")),
        run_slot=due,
        now=due,
        status="running",
        fence_pid=None,
        lease_seconds=LEASE.total_seconds(),
    )
    assert claimed is not None and claimed.status == "running"
    # A day later the lease is long gone and no body runs anywhere; the next slot is a
    # year away. The operator asks for a run now.
    await run_job_now(engine, "yearly", lease_now=due + timedelta(days=1))
