"""Work that outlives its run holds the run's lease, however it was started: an async
job body that starts a task of its own and returns leaves that task running, and the
thread the task then starts (``asyncio.to_thread``) is the run's work as much as one
started by the body itself. No next run of the job starts beside it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import CopiesInThreads, StartScheduler, wait_for_runs, wait_for_runs_past_busy_rows

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = 30


async def test_a_thread_started_by_a_task_the_body_left_behind_holds_off_the_next_run(
    start_scheduler: StartScheduler, engine: AsyncEngine, copies_in_threads: CopiesInThreads
) -> None:
    clock = FakeClock(T0)
    copies = copies_in_threads
    handed_over = asyncio.Event()
    left_behind: set[asyncio.Task[None]] = set()
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="flush", name="Flush")
    async def flush(ctx: JobContext) -> None:
        if left_behind:
            await copies.run_one("second run")
            return

        async def finish_later() -> None:
            # A flush the body hands to a task of its own and does not wait for.
            await handed_over.wait()
            await copies.run_one("first run's task")

        task = asyncio.create_task(finish_later())
        left_behind.add(task)

    supervisor = await start_scheduler(scheduler, clock=clock, lease_seconds=LEASE)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    assert [status for status, _ in await wait_for_runs(engine, "flush", 1)] == ["ok"]
    handed_over.set()
    await copies.in_thread()
    # The timer, the tick and the renewer of the run's lease park before the clock
    # moves; the claim may meet the job row held for a moment by that renewal.
    await clock.wait_for_sleepers(3)
    clock.advance(10)
    history = await wait_for_runs_past_busy_rows(engine, clock, "flush", 2, sleepers=3)
    copies.release.set()
    await asyncio.gather(*left_behind)
    assert (copies.overlaps(), [status for status, _ in history]) == (
        [],
        ["ok", "skipped_overlap"],
    )
