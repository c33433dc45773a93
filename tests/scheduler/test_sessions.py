"""A job's session commits when the body returns and rolls back when it raises."""

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Role, Scheduler, every

from .conftest import StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
INSERT = text("INSERT INTO job_notes (note) VALUES ('written by the job')")


@pytest.fixture
async def notes(engine: AsyncEngine) -> Callable[[], Awaitable[int]]:
    """A table the job writes to; returns a counter of its rows."""
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE job_notes (id serial PRIMARY KEY, note text)"))

    async def count() -> int:
        async with engine.connect() as conn:
            rows: int = (await conn.execute(text("SELECT count(*) FROM job_notes"))).scalar_one()
            return rows

    return count


async def _fire_once(
    start_scheduler: StartScheduler, engine: AsyncEngine, scheduler: Scheduler
) -> str:
    clock = FakeClock(T0)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_for_role(Role.LEADER)
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    [(status, _)] = await wait_for_runs(engine, "writer", 1)
    return status


async def test_an_async_job_that_returns_leaves_its_rows_committed(
    start_scheduler: StartScheduler, engine: AsyncEngine, notes: Callable[[], Awaitable[int]]
) -> None:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="writer")
    async def writer(ctx: JobContext) -> None:
        await ctx.session.execute(INSERT)

    assert await _fire_once(start_scheduler, engine, scheduler) == "ok"
    assert await notes() == 1


async def test_an_async_job_that_raises_leaves_no_rows(
    start_scheduler: StartScheduler, engine: AsyncEngine, notes: Callable[[], Awaitable[int]]
) -> None:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="writer")
    async def writer(ctx: JobContext) -> None:
        await ctx.session.execute(INSERT)
        raise RuntimeError("half way")

    assert await _fire_once(start_scheduler, engine, scheduler) == "error"
    assert await notes() == 0


async def test_a_thread_job_that_returns_leaves_its_rows_committed(
    start_scheduler: StartScheduler, engine: AsyncEngine, notes: Callable[[], Awaitable[int]]
) -> None:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="writer")
    def writer(ctx: JobContext) -> None:
        ctx.sync_session.execute(INSERT)

    assert await _fire_once(start_scheduler, engine, scheduler) == "ok"
    assert await notes() == 1


async def test_a_thread_job_that_raises_leaves_no_rows(
    start_scheduler: StartScheduler, engine: AsyncEngine, notes: Callable[[], Awaitable[int]]
) -> None:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="writer")
    def writer(ctx: JobContext) -> None:
        ctx.sync_session.execute(INSERT)
        raise RuntimeError("half way")

    assert await _fire_once(start_scheduler, engine, scheduler) == "error"
    assert await notes() == 0
