"""Leader-only services and per-replica jobs."""

import asyncio
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Role, Scheduler, ServiceContext, every

from .conftest import StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def test_service_runs_while_leading_and_is_cancelled_on_stop(
    start_scheduler: StartScheduler,
) -> None:
    scheduler = Scheduler()
    started, cancelled = asyncio.Event(), asyncio.Event()

    @scheduler.service(id="long_poll", name="Long poll")
    async def long_poll(ctx: ServiceContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    await asyncio.wait_for(started.wait(), 5)
    await scheduler.stop()
    assert cancelled.is_set()


async def test_service_does_not_run_on_a_standby(start_scheduler: StartScheduler) -> None:
    leader = await start_scheduler(Scheduler())
    await leader.wait_for_role(Role.LEADER)
    scheduler = Scheduler()
    ran = asyncio.Event()

    @scheduler.service(id="long_poll")
    async def long_poll(ctx: ServiceContext) -> None:
        ran.set()

    standby = await start_scheduler(scheduler)
    await standby.wait_for_role(Role.STANDBY)
    assert not ran.is_set()


async def test_crashed_service_restarts_with_backoff(start_scheduler: StartScheduler) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    attempts = 0
    second_attempt = asyncio.Event()

    @scheduler.service(id="flaky_poll")
    async def flaky_poll(ctx: ServiceContext) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("upstream closed the long poll")
        second_attempt.set()
        await asyncio.Event().wait()

    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_for_role(Role.LEADER)
    # Parked: the leader tick and the service's backoff sleep.
    await clock.wait_for_sleepers(2)
    assert attempts == 1
    clock.advance(1)
    await asyncio.wait_for(second_attempt.wait(), 5)


async def test_replica_job_runs_on_every_worker_without_a_claim(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    workers: list[Scheduler] = []
    for _ in range(2):
        scheduler = Scheduler()

        @scheduler.job(every(minutes=5), id="sweep", leader_only=False)
        async def sweep(ctx: JobContext) -> None:
            return None

        workers.append(scheduler)
    for scheduler in workers:
        await start_scheduler(scheduler, clock=clock)
    # Both replica loops, one leader tick.
    await clock.wait_for_sleepers(3)
    clock.advance(300)
    history = await wait_for_runs(engine, "sweep", 2)
    assert [status for status, _ in history] == ["ok", "ok"]
    assert {slot for _, slot in history} == {datetime(2026, 1, 1, 0, 5, tzinfo=UTC)}
