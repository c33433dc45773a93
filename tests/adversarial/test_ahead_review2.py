"""Claims prepared ahead of their slot (second cold review): a run-now asked during the
lead, and a worker stopped between the prepared commit and the slot."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.errors import Conflict
from app.admin.queries import run_job_now
from app.scheduler import FakeClock, JobContext, Scheduler, cron

from ..scheduler.conftest import StartScheduler, eventually, runs

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
SLOT = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
IN_THE_LEAD = 29.8


async def _prepared_claim_pid(engine: AsyncEngine) -> int | None:
    async with engine.connect() as conn:
        return (
            await conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE state = 'idle in transaction'"
                    " AND query LIKE '%INSERT INTO scheduler_runs%'"
                )
            )
        ).scalar()


async def _a_statement_waits_for_a_row_lock(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        waiting = await conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        )
        return bool(waiting.scalar_one())


def _job(
    scheduler: Scheduler, started: list[tuple[datetime, bool]], release: asyncio.Event
) -> None:
    @scheduler.job(cron("* * * * *"), id="minutely")
    async def minutely(ctx: JobContext) -> None:
        started.append((ctx.scheduled_at, False))
        await release.wait()


async def test_a_run_now_asked_during_the_lead_is_refused_or_runs(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    started: list[tuple[datetime, bool]] = []
    release = asyncio.Event()
    _job(scheduler, started, release)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: _pid_is_set(engine), what="a prepared claim")
    # The operator asks for a run now 0.2 s before the slot: the job is not running
    # (nothing committed yet), so the request is accepted (no Conflict).
    asking = asyncio.create_task(
        run_job_now(engine, "minutely", clock.now(), lease_now=clock.now())
    )
    await eventually(lambda: _a_statement_waits_for_a_row_lock(engine), what="the request")
    clock.set(SLOT)
    try:
        await asyncio.wait_for(asking, 10)
    except Conflict:
        # Told at once that the job runs (its request waited for the claim's commit).
        release.set()
        clock.advance(1)
        await eventually(lambda: _settled(engine, 1), what="the slot's run to end")
        assert await runs(engine, "minutely") == [("ok", SLOT)]
        return
    await eventually(lambda: _has_runs(engine, 2), what="two run rows")
    release.set()
    clock.advance(1)
    await eventually(lambda: _settled(engine, 2), what="both runs to end")
    statuses = [s for s, _ in await runs(engine, "minutely")]
    assert statuses == ["ok", "ok"], f"an accepted run-now request did not run: {statuses}"


async def _settled(engine: AsyncEngine, count: int) -> bool:
    statuses = [s for s, _ in await runs(engine, "minutely")]
    return len(statuses) >= count and "running" not in statuses


async def _pid_is_set(engine: AsyncEngine) -> bool:
    return await _prepared_claim_pid(engine) is not None


async def _has_runs(engine: AsyncEngine, count: int) -> bool:
    return len(await runs(engine, "minutely")) >= count


async def test_a_worker_stopped_between_the_prepared_commit_and_the_slot_records_it_once(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    first, second = Scheduler(), Scheduler()
    started_first: list[tuple[datetime, bool]] = []
    started_second: list[tuple[datetime, bool]] = []
    release = asyncio.Event()
    release.set()
    _job(first, started_first, release)
    _job(second, started_second, release)
    leader = await start_scheduler(first, clock=clock)
    await leader.wait_until_firing()
    standby = await start_scheduler(second, clock=clock)
    await clock.wait_for_sleepers(3)

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: _pid_is_set(engine), what="a prepared claim")
    clock.set(SLOT - timedelta(milliseconds=1))
    await eventually(lambda: _not_pid(engine), what="the prepared claim to commit")
    await first.stop()
    await standby.wait_until_firing()
    clock.set(SLOT + timedelta(seconds=1))
    await eventually(lambda: _settled(engine, 1), what="the slot to be recorded")
    assert await runs(engine, "minutely") == [("cancelled", SLOT)]
    assert started_first == started_second == []


async def _not_pid(engine: AsyncEngine) -> bool:
    return await _prepared_claim_pid(engine) is None
