"""Leader-only services and per-replica jobs. A service that crashes while its worker
leads is restarted, whatever it raises: a CancelledError of its own (an inner task it
awaited was cancelled, nobody cancelled the service) is a crash like any other."""

import asyncio
import contextlib
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Role, Scheduler, ServiceContext, every
from app.scheduler.election import WAKE_CHANNEL
from app.testing import TestServer

from .conftest import StartScheduler, eventually, wait_for_runs

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
    # Parked: the leader tick, the renewal of the service's running lease and the
    # service's backoff sleep.
    await clock.wait_for_sleepers(3)
    assert attempts == 1
    clock.advance(1)
    await asyncio.wait_for(second_attempt.wait(), 5)


async def _fails_at_once() -> None:
    await asyncio.sleep(0)
    raise ConnectionError("the LISTEN connection was lost")


async def test_a_service_whose_task_group_failed_is_restarted(
    start_scheduler: StartScheduler,
) -> None:
    scheduler = Scheduler()
    attempts = 0
    second_attempt = asyncio.Event()

    @scheduler.service(id="drain")
    async def drain(ctx: ServiceContext) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            # Its child fails after the group's body ended: Python 3.11 leaves the
            # task's cancelling() count raised though nothing cancelled it.
            async with asyncio.TaskGroup() as group:
                group.create_task(_fails_at_once())
        second_attempt.set()
        await asyncio.Event().wait()

    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    # Restarted after the first backoff (1 s on the real clock).
    await asyncio.wait_for(second_attempt.wait(), 5)


async def _cancelled_child() -> None:
    await asyncio.Event().wait()


async def test_a_service_that_raises_an_inner_tasks_cancel_while_leading_is_restarted(
    start_scheduler: StartScheduler,
) -> None:
    scheduler = Scheduler()
    attempts = 0
    second_attempt = asyncio.Event()

    @scheduler.service(id="poll")
    async def poll(ctx: ServiceContext) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            # e.g. a client library cancels its own request task on a protocol error
            # and the await re-raises that task's CancelledError.
            child = asyncio.ensure_future(_cancelled_child())
            await asyncio.sleep(0)
            child.cancel()
            await child
        second_attempt.set()
        await asyncio.Event().wait()

    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    # Restarted after the first backoff (1 s on the real clock).
    await asyncio.wait_for(second_attempt.wait(), 5)
    assert supervisor.role == Role.LEADER


async def _fails_as_it_is_cancelled() -> None:
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        # Its statement's connection died with the server in the same instant.
        raise ConnectionError("connection was closed in the middle of operation") from None


@pytest.mark.restarts_server
async def test_a_leader_whose_service_turns_its_cancel_into_an_error_still_steps_down_on_restart(
    start_scheduler: StartScheduler, server: TestServer
) -> None:
    scheduler = Scheduler()
    events: list[str] = []
    started, demoted = asyncio.Event(), asyncio.Event()

    @scheduler.service(id="drain")
    async def drain(ctx: ServiceContext) -> None:
        # The outbox's drain pass: its deliveries run in a task group. On Python 3.11 a
        # group cancelled while a child fails raises the child's error, not the cancel.
        events.append("service started")
        started.set()
        async with asyncio.TaskGroup() as group:
            group.create_task(_fails_as_it_is_cancelled())
            await asyncio.Event().wait()

    def on_role(role: str) -> None:
        events.append(role)
        if role == "standby":
            demoted.set()

    scheduler.observe(on_role=on_role)
    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    await asyncio.wait_for(started.wait(), 5)
    events.clear()
    server.restart()
    await asyncio.wait_for(demoted.wait(), 10)
    assert "service started" not in events[: events.index("standby")]


async def test_a_service_that_returns_from_its_cancel_is_not_restarted(
    start_scheduler: StartScheduler,
) -> None:
    scheduler = Scheduler()
    starts = 0
    started = asyncio.Event()

    @scheduler.service(id="swallows_cancel")
    async def swallows_cancel(ctx: ServiceContext) -> None:
        nonlocal starts
        starts += 1
        started.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()

    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_for_role(Role.LEADER)
    await asyncio.wait_for(started.wait(), 5)
    await asyncio.wait_for(scheduler.stop(), 5)
    assert starts == 1


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


async def test_a_new_leader_starts_its_services_only_after_the_whole_handover_grace(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    """A service has no fence: when the old leader's backend is gone, the new leader's
    jobs may fire at once (their claims are fenced), but its services wait out the
    handover grace, which is what lets the old leader notice its loss and stop its own."""
    clock = FakeClock(T0)
    grace = 5.0
    started: list[str] = []

    def with_service(label: str) -> Scheduler:
        scheduler = Scheduler()

        @scheduler.service(id="long_poll")
        async def long_poll(ctx: ServiceContext) -> None:
            started.append(label)
            await asyncio.Event().wait()

        return scheduler

    old = await start_scheduler(with_service("old"), clock=clock, handover_grace_seconds=grace)
    await old.wait_for_role(Role.LEADER)
    await clock.wait_for_sleepers(1)
    clock.advance(grace)
    await old.wait_until_firing()

    async def old_service_started() -> bool:
        # Firing comes first; the copy starts once its lease is taken.
        return started == ["old"]

    await eventually(old_service_started, what="the old leader's service")
    new = await start_scheduler(with_service("new"), clock=clock, handover_grace_seconds=grace)
    await new.wait_for_role(Role.STANDBY)
    assert old.lock is not None
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": old.lock.backend_pid})
    # The old backend is gone: the new leader cuts its grace short and fires.
    await new.wait_until_firing()
    assert started == ["old"]
    clock.advance(grace)

    async def new_service_started() -> bool:
        if started == ["old", "new"]:
            return True
        # A take that met the old copy's lease before its release landed is tried again
        # after retry.SERVICE_RESTART's wait, on the clock, which only the test moves.
        clock.advance(0.5)
        return False

    await eventually(new_service_started, what="the new leader's service")


async def test_a_leader_whose_lock_connection_dies_mid_tick_stops_its_services_at_once(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    """A service has no fence: a new leader starts its own once the handover grace has
    passed, counting on the old one to stop its copy as soon as it learns that its lock
    connection died, even while the old leader's tick waits on the database."""
    clock = FakeClock(T0)
    scheduler = Scheduler()
    started, cancelled = asyncio.Event(), asyncio.Event()

    @scheduler.service(id="long_poll")
    async def long_poll(ctx: ServiceContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await asyncio.wait_for(started.wait(), 5)
    assert supervisor.lock is not None
    lock_pid = supervisor.lock.backend_pid
    async with engine.connect() as blocker, engine.connect() as other:
        # The tick's last statement, the heartbeat, waits for this row lock.
        await blocker.execute(text("SELECT 1 FROM scheduler_leadership FOR UPDATE"))
        await other.execute(text(f"NOTIFY {WAKE_CHANNEL}"))
        await other.commit()

        async def heartbeat_waits() -> bool:
            waiting = await other.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND query LIKE '%SET heartbeat_at%'"
                )
            )
            await other.commit()
            return bool(waiting.scalar_one())

        await eventually(heartbeat_waits, what="the tick's heartbeat waiting on the row lock")
        await other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": lock_pid})
        await other.commit()
        await asyncio.wait_for(cancelled.wait(), 5)
        await blocker.rollback()
