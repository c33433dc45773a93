"""A thundering slot: many leader jobs due at the same instant. One wake of the leader
claims them all in one statement, and jobs that share a trigger share its slot math:
with a claim and a croniter walk per job, the last of 1,000 jobs on one cron minute
started seconds after its slot."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
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


async def test_a_thousand_jobs_due_at_once_are_claimed_by_one_statement(
    start_scheduler: StartScheduler, engine: AsyncEngine, claim_statements: list[str]
) -> None:
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
