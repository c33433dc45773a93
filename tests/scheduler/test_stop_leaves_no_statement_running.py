"""A stopped scheduler leaves no statement of its own running: after ``stop()``,
``wait_for_threads()`` returns only once every statement the scheduler started (a
service copy's lease take cut off by the stop, a write carried past a cancel) has ended
and given its pooled connection back. The app disposes the engine right after; a
statement still running then returns its connection to a disposed pool, which never
closes it."""

from __future__ import annotations

import asyncio

from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.pool import QueuePool

from app.scheduler import Role, Scheduler, ServiceContext

from ..conftest import StartScheduler, statement_waits_on_a_lock
from .conftest import eventually, service_row_held


def _scheduler_with_a_service(started: asyncio.Event) -> Scheduler:
    scheduler = Scheduler()

    @scheduler.service(id="consumer")
    async def consumer(ctx: ServiceContext) -> None:
        started.set()
        await asyncio.Event().wait()

    return scheduler


async def test_a_stopped_scheduler_has_no_lease_take_holding_a_connection(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    # A first leadership makes the service's row, which another session then holds.
    first_started = asyncio.Event()
    first = _scheduler_with_a_service(first_started)
    await start_scheduler(first)
    await asyncio.wait_for(first_started.wait(), 10)
    await first.stop()

    scheduler = _scheduler_with_a_service(asyncio.Event())
    async with service_row_held(engine, "consumer") as holder:
        supervisor = await start_scheduler(scheduler)
        await supervisor.wait_for_role(Role.LEADER)
        # The copy's lease take waits on the held row when the stop cuts it off.
        await eventually(
            lambda: statement_waits_on_a_lock(engine, "scheduler_services"),
            what="the lease take to wait",
        )
        await scheduler.stop()
        # What the app's lifespan waits for before it disposes the engine.
        waiting = asyncio.create_task(scheduler.wait_for_threads())
        await holder.rollback()
    await waiting
    pool = engine.pool
    assert isinstance(pool, QueuePool)
    assert pool.checkedout() == 0, (
        "Scheduler.wait_for_threads() returned while a lease take of the stopped "
        "scheduler still held a pooled connection; disposed next, the engine would "
        "never close it"
    )
