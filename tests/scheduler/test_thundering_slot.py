"""A thundering slot: many leader jobs due at the same instant. One wake of the leader
claims them all in one statement, and jobs that share a trigger share its slot math:
with a claim and a croniter walk per job, the last of 1,000 jobs on one cron minute
started seconds after its slot."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import Cron, FakeClock, JobContext, Scheduler, cron

from .conftest import StartScheduler, eventually

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
CROWD = 1_000

_SLOT_MATH: collections.Counter[str] = collections.Counter()


@dataclass(frozen=True)
class _CountingCron(Cron):
    """A cron that counts how often its slot math runs."""

    def latest_slot(self, due: datetime, now: datetime, zone: ZoneInfo) -> tuple[datetime, int]:
        _SLOT_MATH["latest_slot"] += 1
        return super().latest_slot(due, now, zone)


async def _noop(ctx: JobContext) -> None:
    return None


@pytest.fixture
def claim_statements(engine: AsyncEngine) -> Iterator[list[str]]:
    """Every slot-claim statement sent on the engine, as the database received it."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        claim = statement.lstrip().startswith("UPDATE scheduler_jobs")
        if claim and "running_run_id = CASE" in statement:
            sent.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    yield sent
    event.remove(engine.sync_engine, "before_cursor_execute", record)


async def _finished_runs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count: int = (
            await conn.execute(text("SELECT count(*) FROM scheduler_runs WHERE status = 'ok'"))
        ).scalar_one()
        return count


async def _fire_a_noop_crowd(start_scheduler: StartScheduler, engine: AsyncEngine) -> None:
    """CROWD no-op jobs on one cron minute: fire the minute, return once all ran."""
    clock = FakeClock(T0)
    scheduler = Scheduler()
    for index in range(CROWD):
        scheduler.job(cron("* * * * *"), id=f"crowd-{index:04d}")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(30)

    async def all_ran() -> bool:
        return await _finished_runs(engine) == CROWD

    await eventually(all_ran, timeout=60, what=f"{CROWD} runs")


async def test_a_thousand_jobs_due_at_once_are_claimed_by_one_statement(
    start_scheduler: StartScheduler, engine: AsyncEngine, claim_statements: list[str]
) -> None:
    await _fire_a_noop_crowd(start_scheduler, engine)
    assert len(claim_statements) == 1


async def test_jobs_that_share_a_trigger_compute_its_slot_once_per_wake(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    shared = _CountingCron("* * * * *")
    scheduler = Scheduler()
    for index in range(100):
        scheduler.job(shared, id=f"shared-{index:03d}")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    _SLOT_MATH.clear()
    clock.advance(30)

    async def all_ran() -> bool:
        return await _finished_runs(engine) == 100

    await eventually(all_ran, timeout=30, what="100 runs")
    assert _SLOT_MATH["latest_slot"] == 1


@pytest.fixture
def outcome_and_renewal_statements(engine: AsyncEngine) -> Iterator[collections.Counter[str]]:
    """How many outcome writes and lease renewals the engine sent, by kind."""
    sent: collections.Counter[str] = collections.Counter()

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        words = " ".join(statement.split())
        if words.startswith("UPDATE scheduler_runs") and "SET finished_at" in words:
            sent["outcome"] += 1
        elif words.startswith("WITH runs AS ( UPDATE scheduler_runs r SET running_until ="):
            sent["renewal"] += 1

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    yield sent
    event.remove(engine.sync_engine, "before_cursor_execute", record)


async def test_the_outcomes_of_a_thousand_bodies_that_end_together_are_written_in_batches(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    outcome_and_renewal_statements: collections.Counter[str],
) -> None:
    await _fire_a_noop_crowd(start_scheduler, engine)
    # One write per outcome held a pool connection each: behind a crowd, outcomes
    # waited out their record timeout and were lost.
    assert outcome_and_renewal_statements["outcome"] <= CROWD // 20


async def test_a_thousand_running_bodies_renew_their_leases_in_one_statement_per_period(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    outcome_and_renewal_statements: collections.Counter[str],
) -> None:
    clock = FakeClock(T0)
    release = asyncio.Event()
    entered: list[str] = []

    async def long_body(ctx: JobContext) -> None:
        entered.append(ctx.job_id)
        await release.wait()

    scheduler = Scheduler()
    for index in range(CROWD):
        scheduler.job(cron("* * * * *"), id=f"crowd-{index:04d}")(long_body)
    supervisor = await start_scheduler(scheduler, clock=clock, lease_seconds=6)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(30)
    while len(entered) < CROWD:
        await asyncio.sleep(0.01)
    await clock.wait_for_sleepers()
    outcome_and_renewal_statements.clear()
    clock.advance(2)  # a third of the lease: every lease is due for renewal

    async def renewed() -> bool:
        async with engine.connect() as conn:
            stale: int = (
                await conn.execute(
                    text(
                        "SELECT count(*) FROM scheduler_jobs"
                        " WHERE running_until < CAST(:fresh AS timestamptz)"
                    ),
                    {"fresh": clock.now() + timedelta(seconds=6)},
                )
            ).scalar_one()
            return stale == 0

    await eventually(renewed, timeout=30, what="every lease renewed")
    assert outcome_and_renewal_statements["renewal"] == 1
    release.set()
