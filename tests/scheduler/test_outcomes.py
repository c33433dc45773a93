"""Every claimed run ends with a recorded outcome, however its task is cancelled."""

import asyncio
from collections.abc import Sequence
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.runner import Claim, Due
from app.scheduler.store import PreparedCommit
from app.testing import run_job
from app.testing.claims import claim_leader

from .conftest import StartScheduler, eventually, make_runner, runs, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")


async def _lease_holder(engine: AsyncEngine, job_id: str) -> int | None:
    async with engine.connect() as conn:
        holder: int | None = (
            await conn.execute(
                text("SELECT running_run_id FROM scheduler_jobs WHERE id = :id"), {"id": job_id}
            )
        ).scalar_one()
        return holder


async def test_a_run_cancelled_before_its_body_started_is_recorded_and_frees_the_job(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    ran = asyncio.Event()

    @scheduler.job(every(seconds=10), id="early")
    async def early(ctx: JobContext) -> None:
        ran.set()

    spec = scheduler.jobs["early"]
    runner = make_runner(database, clock)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    clock.advance(10)
    claim = await claim_leader(runner, spec, rows["early"].next_run_at, None)
    assert claim is not None and claim.runs
    body = runner.start(spec, claim)
    body.cancel()  # a demotion right after the claim, before the task's first step
    await asyncio.gather(body, return_exceptions=True)

    async def recorded() -> bool:
        return await runs(engine, "early") == [("cancelled", claim.slot)]

    await eventually(recorded, what="the never-started run recorded as cancelled")
    assert await _lease_holder(engine, "early") is None
    assert not ran.is_set()


async def test_waiting_for_the_bodies_waits_for_the_record_of_a_run_cancelled_before_it_started(
    database: Database, engine: AsyncEngine
) -> None:
    # The app disposes its engine once the bodies are waited for: a record still being
    # written then would hold a pool connection across dispose(), and leak it.
    clock = FakeClock(T0)
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="early")
    async def early(ctx: JobContext) -> None:
        return None

    spec = scheduler.jobs["early"]
    runner = make_runner(database, clock)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    clock.advance(10)
    claim = await claim_leader(runner, spec, rows["early"].next_run_at, None)
    assert claim is not None and claim.runs
    runner.start(spec, claim).cancel()
    await runner.wait_for_bodies()
    assert await runs(engine, "early") == [("cancelled", claim.slot)]


async def test_an_outcome_write_cut_by_a_demotion_still_lands(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    body_done = asyncio.Event()

    @scheduler.job(every(seconds=10), id="finished")
    async def finished(ctx: JobContext) -> None:
        body_done.set()

    spec = scheduler.jobs["finished"]
    runner = make_runner(database, clock)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    clock.advance(10)
    claim = await claim_leader(runner, spec, rows["finished"].next_run_at, None)
    assert claim is not None
    # Another session holds the job row: the outcome write waits on it.
    async with engine.connect() as blocker:
        await blocker.execute(text("SELECT 1 FROM scheduler_jobs WHERE id = 'finished' FOR UPDATE"))
        body = runner.start(spec, claim)
        await body_done.wait()

        async def writing() -> bool:
            async with engine.connect() as conn:
                waiting: int = (
                    await conn.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                            " AND datname = current_database()"
                        )
                    )
                ).scalar_one()
                return waiting > 0

        await eventually(writing, what="the outcome write waiting on the row")
        body.cancel()  # the demotion lands while the outcome is being written
        await asyncio.gather(body, return_exceptions=True)
        await blocker.rollback()

    async def recorded() -> bool:
        return await runs(engine, "finished") == [("ok", claim.slot)]

    await eventually(recorded, what="the body's real outcome recorded")
    assert await _lease_holder(engine, "finished") is None


async def _raises_with_a_nul_byte(ctx: JobContext) -> None:
    # e.g. a parser quoting the raw bytes it choked on
    raise ValueError("unexpected byte in record: 'ab\x00cd'")


async def test_a_body_whose_error_text_holds_a_nul_byte_is_recorded_as_error(
    database: Database,
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(minutes=5), id="nul_error")(_raises_with_a_nul_byte)
    record = await run_job(scheduler, "nul_error", database=database, at=T0)
    assert record.status == "error", f"the run stayed {record.status!r}: {record}"


async def test_a_run_whose_claim_commits_as_its_leader_steps_down_is_recorded_cancelled(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    # The step-down cancels the job timer: a claim that committed on the server but
    # whose answer had not reached the timer yet must still be recorded, not left
    # 'running' until its lease runs out.
    clock = FakeClock(T0)
    scheduler = Scheduler()
    ran = asyncio.Event()

    @scheduler.job(every(seconds=10), id="late_answer")
    async def late_answer(ctx: JobContext) -> None:
        ran.set()

    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    claim_many = supervisor.runner.claim_many
    committed = asyncio.Event()

    async def answered_once_the_step_down_began(
        dues: Sequence[Due], fence_pid: int | None, prepared: PreparedCommit | None = None
    ) -> list[Claim | Exception | None]:
        supervisor.runner.claim_many = claim_many  # type: ignore[method-assign]
        claims = await claim_many(dues, fence_pid, prepared)
        committed.set()
        # The step-down clears the flag as it cancels the timer.
        while supervisor.firing:
            await asyncio.sleep(0.01)
        return claims

    supervisor.runner.claim_many = answered_once_the_step_down_began  # type: ignore[method-assign]
    # Parked (the leader's tick and job timer): a step before the timer sleeps is lost.
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await asyncio.wait_for(committed.wait(), 5)
    assert supervisor.lock is not None
    async with engine.begin() as conn:
        await conn.execute(
            text("SELECT pg_terminate_backend(:pid)"), {"pid": supervisor.lock.backend_pid}
        )
    history = await wait_for_runs(engine, "late_answer", 1)
    assert [status for status, _ in history] == ["cancelled"]
    assert not ran.is_set()
