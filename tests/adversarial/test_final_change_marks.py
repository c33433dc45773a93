"""What an operator writes with plain SQL is seen by the leader within a tick, never
missed: also a job row written back whole (deleted and inserted again, as a restore of
the table or a script that recreates the row does). The tick of main reads only rows
whose change mark is set, and an INSERT leaves it at 0."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg

from app.scheduler import FakeClock, JobContext, Scheduler, every

from ..scheduler.conftest import JobRowTraffic, StartScheduler, wait_for_runs
from ..scheduler.conftest import job_row_traffic as job_row_traffic

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_run_now_written_with_the_row_inserted_again_runs_by_the_next_tick(
    start_scheduler: StartScheduler, database_url: str, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="asked")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    other = await psycopg.AsyncConnection.connect(database_url)
    async with other, other.transaction():
        row = await (
            await other.execute(
                "SELECT schedule, name, trigger, leader_only, next_run_at"
                " FROM scheduler_jobs WHERE id = 'asked'"
            )
        ).fetchone()
        assert row is not None
        await other.execute("DELETE FROM scheduler_jobs WHERE id = 'asked'")
        await other.execute(
            "INSERT INTO scheduler_jobs"
            " (schedule, id, name, trigger, leader_only, next_run_at, run_requested_at)"
            " VALUES (%s, 'asked', %s, %s, %s, %s, %s)",
            (*row, T0),
        )
    for _ in range(2):
        await clock.wait_for_sleepers(2)
        job_row_traffic.clear()
        clock.advance(supervisor.config.leader_tick_seconds)
        await asyncio.wait_for(job_row_traffic.heartbeat.wait(), 10)
    assert await wait_for_runs(supervisor.store.engine, "asked", 1, timeout=5) == [("ok", T0)]
