"""A run now that races a slot is still one more run, and the claim is never blocked.

The operator's request reads "now" a moment before a cron slot; the leader claims and
runs that slot; then the request's UPDATE commits, setting next_run_at to the earlier
moment. The leader's next claim coalesces up to the latest cron slot, the one it just
ran, and its history INSERT hits the unique index: the claim fails every tick until the
next cron slot, and the requested run never happens.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from app.operations.jobs import run_job_now
from app.scheduler import FakeClock, JobContext, Scheduler, cron

from .conftest import StartScheduler, wait_for_runs

SLOT = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_run_now_that_races_a_slot_runs_once_more(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = Scheduler()
    scheduler.job(cron("0 * * * *", tz="UTC"), id="hourly")(_noop)
    clock = FakeClock(SLOT - timedelta(minutes=1))
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.set(SLOT)
    await wait_for_runs(engine, "hourly", 1)
    # The request read its "now" one millisecond before the slot.
    await run_job_now(engine, "hourly", lease_now=SLOT - timedelta(milliseconds=1))
    clock.advance(1)
    history = await wait_for_runs(engine, "hourly", 2, timeout=5)
    assert [status for status, _ in history] == ["ok", "ok"]
