"""A run-now or pause written in a session with ``session_replication_role = replica``
(the apply worker of logical replication, a data-fix script that sets it to skip
foreign-key checks) is seen by the leader within a tick: an ordinary trigger does not
fire in such a session, and the tick reads only rows whose change mark moved."""

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


async def test_a_run_now_written_in_a_replica_role_session_runs_by_the_next_tick(
    start_scheduler: StartScheduler, database_url: str, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="asked")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other:
        await other.execute("SET session_replication_role = replica")
        await other.execute(
            "UPDATE scheduler_jobs SET run_requested_at = %s WHERE id = 'asked'", (T0,)
        )
    # One tick: the write committed before it read.
    job_row_traffic.clear()
    clock.advance(supervisor.config.leader_tick_seconds)
    await asyncio.wait_for(job_row_traffic.heartbeat.wait(), 10)
    assert await wait_for_runs(supervisor.store.engine, "asked", 1, timeout=5) == [("ok", T0)]


async def test_a_leaders_registration_leaves_its_inserts_unmarked_with_the_marks_always_on(
    start_scheduler: StartScheduler, database_url: str
) -> None:
    # The marks fire in every session now; the registration's inserts are still left
    # unmarked by its own transaction setting, so a first boot adds no change to read.
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="registered")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other:
        mark = await (
            await other.execute(
                "SELECT changed_xid::text FROM scheduler_jobs WHERE id = 'registered'"
            )
        ).fetchone()
    assert mark == ("0",)
