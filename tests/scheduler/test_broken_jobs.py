"""One bad job never stops the schedule: a job whose row or next slot cannot be handled
is marked broken (logged once, kept in scheduler_broken_jobs) and every other job fires."""

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, Interval, JobContext, Scheduler, every

from ..conftest import set_on_the_database
from .conftest import StartScheduler, row_held, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


class _PoisonedTrigger(Interval):
    """A trigger whose slot math always raises, as a buggy custom trigger would."""

    def next_after(self, moment: datetime, zone: ZoneInfo) -> datetime:
        raise ArithmeticError("this trigger cannot compute a slot")


async def _noop(ctx: JobContext) -> None:
    return None


def _good_and(poisoned_trigger: Interval) -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="good")(_noop)
    scheduler.job(poisoned_trigger, id="poisoned")(_noop)
    return scheduler


async def _broken(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT job_id, error FROM scheduler_broken_jobs"))
        return {row.job_id: row.error for row in rows}


def _broken_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == "job.broken"]


async def test_a_job_whose_next_slot_cannot_be_computed_is_broken_and_the_rest_fire(
    start_scheduler: StartScheduler, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock(T0)
    scheduler = _good_and(_PoisonedTrigger(timedelta(minutes=1)))
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(60)
    assert await wait_for_runs(engine, "good", 1) == [("ok", T0 + timedelta(minutes=1))]
    broken = await _broken(engine)
    assert list(broken) == ["poisoned"]
    assert "ArithmeticError" in broken["poisoned"]
    [record] = _broken_logs(caplog)
    assert getattr(record, "job_id", None) == "poisoned"


async def test_a_row_the_claim_cannot_update_is_broken_and_the_rest_fire(
    start_scheduler: StartScheduler, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock(T0)
    scheduler = _good_and(every(minutes=1))
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE FUNCTION refuse_poisoned() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'this row cannot be updated'; END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_poisoned BEFORE UPDATE ON scheduler_jobs FOR EACH ROW"
                " WHEN (OLD.id = 'poisoned') EXECUTE FUNCTION refuse_poisoned()"
            )
        )
    for minute in (1, 2, 3):
        # Parked: the leader tick and the job timer.
        await clock.wait_for_sleepers(2)
        clock.advance(60)
        await wait_for_runs(engine, "good", minute)
    broken = await _broken(engine)
    assert list(broken) == ["poisoned"]
    assert "this row cannot be updated" in broken["poisoned"]
    [record] = _broken_logs(caplog)
    assert getattr(record, "job_id", None) == "poisoned"


async def test_a_per_worker_job_whose_slot_cannot_be_computed_stops_no_other(
    start_scheduler: StartScheduler, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="good", leader_only=False)(_noop)
    poisoned = _PoisonedTrigger(timedelta(minutes=1))
    scheduler.job(poisoned, id="poisoned", leader_only=False)(_noop)
    await start_scheduler(scheduler, clock=clock)
    await clock.wait_for_sleepers(3)
    clock.advance(60)
    assert await wait_for_runs(engine, "good", 1) == [("ok", T0 + timedelta(minutes=1))]
    assert list(await _broken(engine)) == ["poisoned"]
    [record] = _broken_logs(caplog)
    assert getattr(record, "job_id", None) == "poisoned"


@pytest.mark.parametrize("timeout", ["lock_timeout", "statement_timeout"])
async def test_a_held_row_under_a_database_timeout_is_retried_and_the_job_is_not_broken(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
    timeout: str,
) -> None:
    """Under the database's own lock_timeout or statement_timeout (a DBA's 200 ms), a
    row another transaction holds (an operator's write, a claim prepared ahead by a
    frozen leader) is busy, not bad, whether the claim left it out or a statement
    waiting for it was cut off: the claim is tried again and the slot runs; the job is
    never marked broken."""
    caplog.set_level(logging.INFO, logger="app.scheduler")
    await set_on_the_database(engine, database_url, timeout, "200ms")
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="held")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    async with row_held(engine, "held") as holder:
        # Parked: the leader tick and the job timer.
        await clock.wait_for_sleepers(2)
        clock.advance(60)
        while not any(
            getattr(record, "action", None) in ("job.broken", "job.busy", "scheduler.claim_failed")
            for record in caplog.records
        ):
            await asyncio.sleep(0.01)
        await holder.rollback()
    await clock.wait_for_sleepers(2)
    clock.advance(1)
    assert await wait_for_runs(engine, "held", 1) == [("ok", T0 + timedelta(minutes=1))]
    assert await _broken(engine) == {}
    assert _broken_logs(caplog) == []


async def test_a_row_busy_past_a_database_timeout_holds_up_no_other_job_of_its_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine, database_url: str
) -> None:
    await set_on_the_database(engine, database_url, "lock_timeout", "200ms")
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="held")(_noop)
    scheduler.job(every(minutes=1), id="free")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    async with row_held(engine, "held") as holder:
        await clock.wait_for_sleepers(2)
        clock.advance(60)
        assert await wait_for_runs(engine, "free", 1) == [("ok", T0 + timedelta(minutes=1))]
        await holder.rollback()
    assert await _broken(engine) == {}
