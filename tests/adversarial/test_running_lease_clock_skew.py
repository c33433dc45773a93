"""The running lease is compared on one clock: a worker whose clock runs ahead of the
owner's (hosts 29 s apart, within the 30 s lease) must not take a live lease for expired."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, Role, Scheduler, every

from ..scheduler.conftest import BlockingBodies, StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = 30
SKEW = timedelta(seconds=29)


def _blocking_job(bodies: BlockingBodies) -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(seconds=10), id="long_thread")(bodies)
    return scheduler


async def test_a_live_running_lease_holds_on_a_worker_whose_clock_runs_ahead(
    start_scheduler: StartScheduler, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock_a, clock_b = FakeClock(T0), FakeClock(T0 + SKEW)
    scheduler_a = _blocking_job(bodies)
    a = await start_scheduler(
        scheduler_a, clock=clock_a, lease_seconds=LEASE, shutdown_grace_seconds=0
    )
    await a.wait_until_firing()
    b = await start_scheduler(_blocking_job(bodies), clock=clock_b, lease_seconds=LEASE)
    await b.wait_for_role(Role.STANDBY)
    await clock_a.wait_for_sleepers(2)
    clock_a.advance(10)
    clock_b.advance(10)
    await bodies.entered()
    # A rolling deploy stops A while its thread runs: it keeps renewing the lease.
    await scheduler_a.stop()
    await b.wait_until_firing()
    await wait_for_runs(engine, "long_thread", 2, finished=False)
    # Both clocks move on together, two seconds: A's lease has 28 s left on A's clock,
    # and A renews it every 10 s for as long as its thread runs.
    clock_a.advance(2)
    clock_b.advance(2)
    history = await wait_for_runs(engine, "long_thread", 3, finished=False)
    assert [status for status, _ in history] == ["running", "skipped_overlap", "skipped_overlap"]
    assert bodies.most_at_once == 1
