"""A job row whose next run an operator set to 'infinity' (PostgreSQL's "never"), or
any slot within its jitter of the last moment Python can hold, never fires, and
stops nothing else: the fire time of such a slot (the slot plus its jitter) cannot be
computed, and the leader planned its jobs, ticked and woke its timer with that sum."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg

from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import JobRowTraffic, StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _noop(ctx: JobContext) -> None:
    return None


def _jobs() -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="never", jitter=30)(_noop)
    scheduler.job(every(hours=1), id="asked")(_noop)
    return scheduler


async def _write(database_url: str, statement: str) -> None:
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(statement)


async def _tick(clock: FakeClock, traffic: JobRowTraffic, seconds: float) -> None:
    # Parked: the leader tick and the job timer (no body runs yet, whose lease keeper
    # would sleep on the clock too).
    await clock.wait_for_sleepers(2)
    traffic.clear()
    clock.advance(seconds)
    await asyncio.wait_for(traffic.heartbeat.wait(), 10)


async def test_a_next_run_set_to_infinity_on_a_jittered_job_stops_no_tick(
    start_scheduler: StartScheduler, database_url: str, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    supervisor = await start_scheduler(_jobs(), clock=clock)
    await supervisor.wait_until_firing()
    tick = supervisor.config.leader_tick_seconds
    await _write(
        database_url, "UPDATE scheduler_jobs SET next_run_at = 'infinity' WHERE id = 'never'"
    )
    await _tick(clock, job_row_traffic, tick)
    await _write(
        database_url,
        f"UPDATE scheduler_jobs SET run_requested_at = '{T0.isoformat()}' WHERE id = 'asked'",
    )
    await _tick(clock, job_row_traffic, tick)
    assert await wait_for_runs(supervisor.store.engine, "asked", 1, timeout=5) == [("ok", T0)]


async def test_a_promotion_over_a_jittered_job_whose_next_run_is_infinity_fires_the_others(
    start_scheduler: StartScheduler, database_url: str
) -> None:
    clock = FakeClock(T0)
    first = await start_scheduler(_jobs(), clock=clock)
    await first.wait_until_firing()
    await _write(
        database_url, "UPDATE scheduler_jobs SET next_run_at = 'infinity' WHERE id = 'never'"
    )
    await _write(
        database_url,
        f"UPDATE scheduler_jobs SET run_requested_at = '{T0.isoformat()}' WHERE id = 'asked'",
    )
    await first.stop()
    second = await start_scheduler(_jobs(), clock=clock)
    await second.wait_until_firing()
    # The promotion read the run-now: its timer fires it with no tick.
    assert await wait_for_runs(second.store.engine, "asked", 1, timeout=5) == [("ok", T0)]
