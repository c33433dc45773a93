"""A busy row delays nothing else: a job row that another transaction holds (an
operator's psql session left open on ``SELECT ... FOR UPDATE``, a stuck script) is left
out of the leader's claim instead of waited on, whatever timeouts the database sets.
Every other job is claimed on time, the held job is tried again until its row is free
and then fires its slot once, and the leader says which row it could not claim."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.operations.jobs import run_job_now
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.store import JobStore

from .conftest import (
    StartScheduler,
    eventually,
    prepared_claim_waits,
    row_held,
    runs,
    wait_for_runs,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SLOT = T0 + timedelta(minutes=1)
OTHER_SLOT = T0 + timedelta(seconds=90)


async def _noop(ctx: JobContext) -> None:
    return None


def _jobs(*job_ids: str) -> Scheduler:
    """Jobs due every minute from SLOT; "other-slot" from OTHER_SLOT, and "asked" (for
    a run-now) from an hour on."""
    firsts = {"other-slot": OTHER_SLOT, "asked": T0 + timedelta(hours=1)}
    scheduler = Scheduler()
    for job_id in job_ids:
        first = firsts.get(job_id)
        first_run = None if first is None else (first - T0).total_seconds()
        scheduler.job(every(minutes=1), id=job_id, first_run=first_run)(_noop)
    return scheduler


def _busy_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "job.busy"]


async def test_a_job_row_held_elsewhere_delays_no_other_jobs_claim(
    start_scheduler: StartScheduler, engine: AsyncEngine, database_timeout: str
) -> None:
    clock = FakeClock(T0)
    supervisor = await start_scheduler(_jobs("held", "same-slot", "other-slot"), clock=clock)
    await supervisor.wait_until_firing()
    async with row_held(engine, "held") as holder:
        # Parked: the leader tick and the job timer.
        await clock.wait_for_sleepers(2)
        clock.set(SLOT)
        assert await wait_for_runs(engine, "same-slot", 1) == [("ok", SLOT)]
        await clock.wait_for_sleepers(2)
        clock.set(OTHER_SLOT)
        assert await wait_for_runs(engine, "other-slot", 1) == [("ok", OTHER_SLOT)]
        assert await runs(engine, "held") == []
        await holder.rollback()


async def test_a_job_row_held_elsewhere_delays_no_claim_prepared_ahead_of_its_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine, database_timeout: str
) -> None:
    clock = FakeClock(T0)
    supervisor = await start_scheduler(_jobs("held", "same-slot"), clock=clock)
    await supervisor.wait_until_firing()
    async with row_held(engine, "held") as holder:
        await clock.wait_for_sleepers(2)
        # Inside the claim lead: the slot's claim is prepared, to commit at the slot.
        clock.set(SLOT - timedelta(seconds=0.2))
        await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
        clock.set(SLOT)
        assert await wait_for_runs(engine, "same-slot", 1) == [("ok", SLOT)]
        assert await runs(engine, "held") == []
        await holder.rollback()


async def test_a_job_row_held_elsewhere_delays_no_run_now_request_of_another_job(
    start_scheduler: StartScheduler, engine: AsyncEngine, database_timeout: str
) -> None:
    clock = FakeClock(T0)
    supervisor = await start_scheduler(_jobs("held", "asked"), clock=clock)
    await supervisor.wait_until_firing()
    async with row_held(engine, "held") as holder:
        await clock.wait_for_sleepers(2)
        # The held job's slot comes due: the leader's claim meets the held row.
        clock.set(SLOT)
        await run_job_now(engine, "asked", lease_now=clock.now())

        async def asked_ran() -> bool:
            return ("ok", SLOT) in await runs(engine, "asked")

        await eventually(asked_ran, what="the run-now of asked")
        assert await runs(engine, "held") == []
        await holder.rollback()


async def test_a_job_row_held_elsewhere_delays_no_other_jobs_registration(
    start_scheduler: StartScheduler, engine: AsyncEngine, database_timeout: str
) -> None:
    """A release changed the held job's trigger, so the promotion must write its row."""
    previous = Scheduler()
    previous.job(every(minutes=2), id="held")(_noop)
    previous.job(every(minutes=1), id="same-slot")(_noop)
    rows = JobStore(engine, pid=0, host="previous-release")
    await rows.register_leader_jobs(previous.jobs.values(), T0, ZoneInfo("UTC"))
    clock = FakeClock(T0)
    async with row_held(engine, "held") as holder:
        supervisor = await start_scheduler(_jobs("held", "same-slot"), clock=clock)
        await supervisor.wait_until_firing()
        await clock.wait_for_sleepers(2)
        clock.set(SLOT)
        assert await wait_for_runs(engine, "same-slot", 1) == [("ok", SLOT)]
        await clock.wait_for_sleepers(2)
        await holder.rollback()
    # Registered with its new trigger once its row is free; its first slot fires.
    clock.advance(supervisor.config.leader_tick_seconds)
    await clock.wait_for_sleepers(2)
    clock.advance(timedelta(minutes=1))
    [(status, _)] = await wait_for_runs(engine, "held", 1)
    assert status == "ok"


async def test_a_job_whose_row_was_held_fires_once_its_row_is_free(
    start_scheduler: StartScheduler, engine: AsyncEngine, database_timeout: str
) -> None:
    clock = FakeClock(T0)
    supervisor = await start_scheduler(_jobs("held", "same-slot"), clock=clock)
    await supervisor.wait_until_firing()
    tick = supervisor.config.leader_tick_seconds
    async with row_held(engine, "held") as holder:
        await clock.wait_for_sleepers(2)
        clock.set(SLOT)
        # The wake that met the held row is over once the other job of the slot ran.
        await wait_for_runs(engine, "same-slot", 1)
        await clock.wait_for_sleepers(2)
        assert await runs(engine, "held") == []
        await holder.rollback()
    # Tried again within a tick of the leader's clock.
    clock.advance(tick)
    assert await wait_for_runs(engine, "held", 1) == [("ok", SLOT)]
    # Once per slot: its next slot is its own run, the held slot never runs again.
    await clock.wait_for_sleepers(2)
    clock.set(SLOT + timedelta(minutes=1))
    assert await wait_for_runs(engine, "held", 2) == [
        ("ok", SLOT),
        ("ok", SLOT + timedelta(minutes=1)),
    ]


async def test_the_leader_says_once_which_job_row_it_could_not_claim_and_when_it_could_again(
    start_scheduler: StartScheduler, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock(T0)
    supervisor = await start_scheduler(_jobs("held", "same-slot"), clock=clock)
    await supervisor.wait_until_firing()
    tick = supervisor.config.leader_tick_seconds
    async with row_held(engine, "held") as holder:
        await clock.wait_for_sleepers(2)
        clock.set(SLOT)
        await wait_for_runs(engine, "same-slot", 1)
        # Three more tries, a tick apart at most: still one line.
        for _ in range(3):
            await clock.wait_for_sleepers(2)
            clock.advance(tick)
        await clock.wait_for_sleepers(2)
        await holder.rollback()
    clock.advance(tick)
    await wait_for_runs(engine, "held", 1)
    [busy] = _busy_logs(caplog)
    assert getattr(busy, "job_id", None) == "held"
    assert "another transaction holds its row" in busy.getMessage()
    assert [
        getattr(r, "job_id", None)
        for r in caplog.records
        if getattr(r, "action", None) == "job.row_free"
    ] == ["held"]
    assert [r for r in caplog.records if getattr(r, "action", None) == "job.broken"] == []
