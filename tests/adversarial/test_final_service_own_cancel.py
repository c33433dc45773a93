"""A service that crashes while its worker leads is restarted, whatever it raises: a
CancelledError of its own (an inner task it awaited was cancelled, nobody cancelled the
service) is a crash like any other while the worker still fires."""

from __future__ import annotations

import asyncio

from app.scheduler import Role, Scheduler, ServiceContext

from ..scheduler.conftest import StartScheduler


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
