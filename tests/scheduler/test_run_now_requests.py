"""A run-now request waits on the job's row until the leader takes it: what it becomes
when it is asked twice, when the job is paused, and when a slot came due before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.operations.jobs import run_job_now, set_paused
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.store import JobStore

from .conftest import BlockingBodies, StartScheduler, eventually, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# The job's first slot: an hour after its row was registered at T0.
SLOT = T0 + timedelta(hours=1)


async def _noop(ctx: JobContext) -> None:
    return None


async def _registered(engine: AsyncEngine, scheduler: Scheduler) -> None:
    """The job rows as a leader registered them at T0, before any leader is running."""
    store = JobStore(engine, pid=1, host="earlier-leader")
    await store.register_leader_jobs(scheduler.jobs.values(), T0, ZoneInfo("UTC"))


async def _history(engine: AsyncEngine, job_id: str) -> list[tuple[Any, ...]]:
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT slot, manual, status FROM scheduler_runs WHERE job_id = :id ORDER BY id"),
            {"id": job_id},
        )
        return [tuple(row) for row in result]


async def _pending_request(engine: AsyncEngine, job_id: str) -> datetime | None:
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT run_requested_at FROM scheduler_jobs WHERE id = :id"), {"id": job_id}
        )
        pending: datetime | None = result.scalar_one()
        return pending


async def _wait_for_history(engine: AsyncEngine, job_id: str, count: int) -> list[tuple[Any, ...]]:
    async def recorded() -> bool:
        return len(await _history(engine, job_id)) >= count

    await eventually(recorded, what=f"{count} runs of {job_id}")
    return await _history(engine, job_id)


async def test_asking_again_while_a_request_is_pending_is_one_run(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(_noop)
    await _registered(engine, scheduler)
    first, second = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    await run_job_now(engine, "hourly", lease_now=first)
    await run_job_now(engine, "hourly", lease_now=second)
    supervisor = await start_scheduler(scheduler, clock=FakeClock(T0 + timedelta(minutes=3)))
    await supervisor.wait_until_firing()
    await wait_for_runs(engine, "hourly", 1)
    # The first request stands, and the one run took it: nothing is left pending.
    assert await _history(engine, "hourly") == [(first, True, "ok")]
    assert await _pending_request(engine, "hourly") is None


async def test_a_pause_drops_a_pending_run_now(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(_noop)
    await _registered(engine, scheduler)
    dropped, asked_after_resume = T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)
    await run_job_now(engine, "hourly", lease_now=dropped)
    await set_paused(engine, "hourly", True)
    await set_paused(engine, "hourly", False)
    await run_job_now(engine, "hourly", lease_now=asked_after_resume)
    supervisor = await start_scheduler(scheduler, clock=FakeClock(T0 + timedelta(minutes=3)))
    await supervisor.wait_until_firing()
    history = await _wait_for_history(engine, "hourly", 1)
    assert [(slot, manual) for slot, manual, _ in history] == [(asked_after_resume, True)]


async def test_a_slot_due_before_a_request_runs_first_and_the_request_meets_its_lease(
    start_scheduler: StartScheduler, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="blocking")(bodies)
    await _registered(engine, scheduler)
    asked = SLOT + timedelta(seconds=1)
    await run_job_now(engine, "blocking", lease_now=asked)
    supervisor = await start_scheduler(scheduler, clock=FakeClock(asked + timedelta(seconds=1)))
    await supervisor.wait_until_firing()
    await bodies.entered()
    history = await _wait_for_history(engine, "blocking", 2)
    # The request is one more run of its own: refused while the slot's body holds the
    # lease, recorded as such and marked manual; the slot is not moved by it.
    assert [(slot, manual, status) for slot, manual, status in history] == [
        (SLOT, False, "running"),
        (asked, True, "skipped_overlap"),
    ]
    async with engine.connect() as conn:
        next_run_at = (
            await conn.execute(text("SELECT next_run_at FROM scheduler_jobs WHERE id = 'blocking'"))
        ).scalar_one()
    assert next_run_at == SLOT + timedelta(hours=1)
    assert await _pending_request(engine, "blocking") is None
