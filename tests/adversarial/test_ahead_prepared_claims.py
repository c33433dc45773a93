"""Claims prepared ahead of their slot, at their edges: a pause seen before the slot, a
late commit, a loss after the commit, a lease that ends within the lead, a wall clock
that slews."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.queries import set_paused
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.clock import SystemClock

from ..scheduler.conftest import (
    StartScheduler,
    eventually,
    lease_elsewhere,
    minutely_recording,
    prepared_claim_waits,
    runs,
)

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
SLOT = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
IN_THE_LEAD = 29.8


async def _a_statement_waits_for_a_row_lock(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        waiting = await conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        )
        return bool(waiting.scalar_one())


async def test_a_pause_committed_and_seen_before_the_slot_starts_no_prepared_body(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    started: list[tuple[datetime, datetime]] = []
    minutely_recording(scheduler, started)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
    # The operator pauses during the lead: the UPDATE waits for the claim's row lock.
    pausing = asyncio.create_task(set_paused(engine, "minutely", True))
    await eventually(lambda: _a_statement_waits_for_a_row_lock(engine), what="the pause to wait")
    # Just past the commit (2 ms + cost before the slot), still before the slot.
    clock.set(SLOT - timedelta(milliseconds=1))
    await asyncio.wait_for(pausing, 10)

    async def leader_saw_the_pause() -> bool:
        row = supervisor._rows.get("minutely")
        return row is not None and row.paused

    # The pause is committed, and the leader has read it (its NOTIFY reload), before the slot.
    await eventually(leader_saw_the_pause, what="the leader to see the pause")
    assert clock.now() < SLOT
    clock.set(SLOT + timedelta(seconds=1))

    async def no_body_left() -> bool:
        return not supervisor._bodies

    await eventually(no_body_left, what="the slot's body to end")
    assert started == [], "a body started after its job's pause was committed and seen"


async def test_a_prepared_claim_that_commits_late_records_when_its_body_really_started(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    started: list[tuple[datetime, datetime]] = []
    minutely_recording(scheduler, started)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
    # The wake is woken late (a busy loop): 0.8 s past the slot, within the server's
    # idle limit (the planned wait plus 1 s).
    clock.set(SLOT + timedelta(seconds=0.8))

    async def ran() -> bool:
        return [row[0] for row in await runs(engine, "minutely")] == ["ok"]

    await eventually(ran, what="the slot's run")
    assert started == [(SLOT, SLOT + timedelta(seconds=0.8))]
    async with engine.connect() as conn:
        run = (await conn.execute(text("SELECT started_at, lateness_ms FROM scheduler_runs"))).one()
    assert (run.started_at, run.lateness_ms) == (SLOT + timedelta(seconds=0.8), 800)


async def test_a_leadership_lost_between_the_prepared_commit_and_the_slot_records_it_cancelled(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    first, second = Scheduler(), Scheduler()
    started_first: list[tuple[datetime, datetime]] = []
    started_second: list[tuple[datetime, datetime]] = []
    minutely_recording(first, started_first)
    minutely_recording(second, started_second)
    leader = await start_scheduler(first, clock=clock)
    await leader.wait_until_firing()
    standby = await start_scheduler(second, clock=clock)
    await clock.wait_for_sleepers(3)
    assert leader.lock is not None

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
    # Past the commit, before the slot: the bodies wait for the slot.
    clock.set(SLOT - timedelta(milliseconds=1))
    await eventually(
        lambda: _not(prepared_claim_waits(engine)), what="the prepared claim to commit"
    )
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT pg_terminate_backend(:pid)"), {"pid": leader.lock.backend_pid}
        )
    await standby.wait_until_firing()
    clock.set(SLOT + timedelta(seconds=1))

    async def settled() -> bool:
        statuses = [status for status, _ in await runs(engine, "minutely")]
        return bool(statuses) and "running" not in statuses

    # The commit's margin (2 ms, or what a crowd's bodies take to start) is the one
    # window in which a claim is in but its body has not begun, as right after any
    # claim: a loss there is recorded, never silent, and never run twice.
    await eventually(settled, what="the slot's run to end")
    assert [status for status, _ in await runs(engine, "minutely")] == ["cancelled"]
    assert started_first == started_second == []


async def _not(condition: object) -> bool:
    assert asyncio.iscoroutine(condition)
    return not await condition


async def test_a_running_lease_that_runs_out_before_the_slot_does_not_skip_the_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    """On the real clock (leases on the server's clock): a previous run's owner died and
    its lease runs out 0.2 s before the slot; at the slot it is reaped and the slot runs
    (it does with claim_ahead_seconds=0)."""
    scheduler = Scheduler()

    @scheduler.job(every(seconds=3600), id="hourly", first_run=3)
    async def hourly(ctx: JobContext) -> None:
        return None

    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_until_firing()
    await lease_elsewhere(engine, "hourly", "next_run_at - interval '0.2 seconds'")

    async def recorded() -> bool:
        return bool(await runs(engine, "hourly"))

    await eventually(recorded, what="the slot's run")
    statuses = [status for status, _ in await runs(engine, "hourly")]
    assert statuses[0] != "skipped_overlap", "a lease that ran out before the slot skipped it"


class _SlowWallClock(SystemClock):
    """A host whose wall clock runs at half the rate of the monotonic clock asyncio
    sleeps on (an exaggerated NTP slew): the wall time a sleep ends at is earlier than
    the one it was computed for, as after a step back of the wall clock."""

    def __init__(self) -> None:
        self._origin = datetime.now(UTC)

    def now(self) -> datetime:
        return self._origin + (datetime.now(UTC) - self._origin) / 2


async def test_no_body_starts_before_its_slot_on_its_own_clock(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = Scheduler()
    began: list[tuple[datetime, datetime]] = []
    done = asyncio.Event()

    @scheduler.job(every(seconds=3600), id="hourly", first_run=1)
    async def hourly(ctx: JobContext) -> None:
        began.append((ctx.scheduled_at, ctx.clock.now()))
        done.set()

    supervisor = await start_scheduler(scheduler, clock=_SlowWallClock())
    await supervisor.wait_until_firing()
    await asyncio.wait_for(done.wait(), 10)
    [(slot, at)] = began
    assert at >= slot, f"the body began {(slot - at).total_seconds():.3f} s before its slot"
