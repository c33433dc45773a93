"""A job's last_status says what runs now: the running lease is the truth for
"running", a skipped or missed slot never hides a body that still runs, and a run
whose owner died is reaped to ``abandoned`` once its lease has passed."""

import asyncio
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.runner import Runner
from app.scheduler.store import JobStore

from .conftest import BlockingBodies, StartScheduler, eventually, runs, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _job_row(engine: AsyncEngine, job_id: str) -> dict[str, object]:
    async with engine.connect() as conn:
        row = (
            await conn.execute(
                text("SELECT last_status, running_run_id FROM scheduler_jobs WHERE id = :id"),
                {"id": job_id},
            )
        ).one()
        return dict(row._mapping)


async def test_a_skipped_overlap_leaves_the_job_running_while_its_body_runs(
    start_scheduler: StartScheduler, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(seconds=10), id="long_thread")(bodies)
    supervisor = await start_scheduler(scheduler, clock=clock, lease_seconds=30)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await bodies.entered()
    await clock.wait_for_sleepers(3)
    clock.advance(10)
    history = await wait_for_runs(engine, "long_thread", 2, finished=False)
    assert [status for status, _ in history] == ["running", "skipped_overlap"]
    assert (await _job_row(engine, "long_thread"))["last_status"] == "running"
    bodies.release.set()
    await wait_for_runs(engine, "long_thread", 2)


async def test_a_run_whose_owner_died_is_reaped_to_abandoned_once_its_lease_passes(
    start_scheduler: StartScheduler, database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()

    @scheduler.job(every(hours=1), id="orphaned")
    async def orphaned(ctx: JobContext) -> None:
        return None

    spec = scheduler.jobs["orphaned"]
    # A process that claimed a slot with a 15 s running lease, then died.
    dead = Runner(
        JobStore(database.engine, pid=999_999, host="gone", lease_clock=clock),
        clock=clock,
        zone=ZoneInfo("UTC"),
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=15,
    )
    rows = await dead.store.register_leader_jobs([spec], clock.now(), ZoneInfo("UTC"))
    clock.set(rows["orphaned"].next_run_at)
    assert await dead.claim_leader(spec, rows["orphaned"].next_run_at, None) is not None
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    assert (await _job_row(engine, "orphaned"))["last_status"] == "running"
    await clock.wait_for_sleepers(2)
    clock.advance(16)

    async def reaped() -> bool:
        return [status for status, _ in await runs(engine, "orphaned")] == ["abandoned"]

    await eventually(reaped, what="the dead owner's run reaped")
    assert await _job_row(engine, "orphaned") == {
        "last_status": "abandoned",
        "running_run_id": None,
    }


async def test_a_leader_runs_lateness_counts_from_its_jittered_fire_time(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()

    @scheduler.job(every(minutes=1), id="jittered", jitter=30)
    async def jittered(ctx: JobContext) -> None:
        return None

    slot = T0 + timedelta(minutes=1)
    jitter = scheduler.jobs["jittered"].jitter_delay(slot)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.set(slot + timedelta(seconds=jitter))
    await wait_for_runs(engine, "jittered", 1)
    async with engine.connect() as conn:
        run = (await conn.execute(text("SELECT lateness_ms, jitter_ms FROM scheduler_runs"))).one()
    assert (run.lateness_ms, run.jitter_ms) == (0, int(jitter * 1000))


async def test_an_outcome_whose_write_lost_its_connection_is_still_recorded(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    release = asyncio.Event()

    @scheduler.job(every(hours=1), id="brief", first_run=0)
    async def brief(ctx: JobContext) -> None:
        await release.wait()

    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await wait_for_runs(engine, "brief", 1, finished=False)
    async with engine.connect() as blocker:
        # The job row locked: the outcome write waits on it, mid-transaction.
        await blocker.execute(text("SELECT 1 FROM scheduler_jobs WHERE id = 'brief' FOR UPDATE"))
        release.set()

        async def writer() -> int | None:
            async with engine.connect() as conn:
                pid: int | None = (await conn.execute(_OUTCOME_WRITER)).scalar_one_or_none()
                return pid

        await eventually(lambda: _is_not_none(writer()), what="the outcome write waiting")
        # Its connection is lost there (a server restart, a terminated backend).
        async with engine.begin() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": await writer()})
        await blocker.rollback()

    async def recorded() -> bool:
        return [status for status, _ in await runs(engine, "brief")] == ["ok"]

    await eventually(recorded, what="the run's outcome recorded")


# The backend of the outcome write, while it waits on the job row's lock.
_OUTCOME_WRITER = text(
    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    " AND query LIKE '%UPDATE scheduler_jobs%last_finished_at%'"
)


async def _is_not_none(value: Awaitable[object]) -> bool:
    return await value is not None
