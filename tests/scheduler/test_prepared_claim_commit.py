"""A claim prepared ahead commits just before its slot, and its slot is decided and
begun at the slot. Bodies begin at the slot, never before it on their own clock, and
with no cyclic collection while a crowd of them begins; a commit that comes late
records when its body really started. Whether the slot runs beside another run (here,
in another process, or one whose owner died) is judged at the slot, not when the claim
was prepared. A leadership lost or a worker stopped between the commit and the slot
records the slot cancelled, once, and runs no body."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, cron, every
from app.scheduler.clock import SystemClock

from .conftest import (
    BlockingBodies,
    StartScheduler,
    eventually,
    lease_elsewhere,
    minutely_recording,
    prepared_claim_waits,
    runs,
    runs_settled,
)

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
SLOT = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
# Inside the default claim lead (0.5 s) of SLOT.
IN_THE_LEAD = 29.8


async def _not(condition: object) -> bool:
    assert asyncio.iscoroutine(condition)
    return not await condition


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


@pytest.fixture
def eager_collector() -> Iterator[list[float]]:
    """The cyclic collector run at nearly every allocation; yields when each run began."""
    collections: list[float] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(time.perf_counter())

    thresholds = gc.get_threshold()
    gc.set_threshold(1, 1, 1)
    gc.callbacks.append(record)
    yield collections
    gc.callbacks.remove(record)
    gc.set_threshold(*thresholds)


async def test_the_collector_does_not_run_while_a_crowd_of_bodies_begins(
    start_scheduler: StartScheduler, engine: AsyncEngine, eager_collector: list[float]
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    began: list[float] = []
    done = asyncio.Event()

    async def body(ctx: JobContext) -> None:
        began.append(time.perf_counter())
        if len(began) == 50:
            done.set()

    for index in range(50):
        scheduler.job(cron("* * * * *"), id=f"crowd-{index:02d}")(body)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(30)
    await asyncio.wait_for(done.wait(), 30)

    assert [moment for moment in eager_collector if began[0] <= moment <= began[-1]] == []


async def test_whether_a_slot_runs_while_its_last_body_still_runs_here_is_decided_at_the_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(seconds=60), id="long", first_run=1)(bodies)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(1)
    await bodies.entered()

    # Within the next slot's lead the first body still runs; it ends before the slot.
    clock.advance(59.8)
    # The timer, the tick and the running body's lease renewal park again.
    await clock.wait_for_sleepers(3)
    assert not await prepared_claim_waits(engine)
    bodies.release.set()

    async def first_body_ended() -> bool:
        return "long" not in supervisor.running_job_ids

    await eventually(first_body_ended, what="the first body to end")
    clock.advance(0.2)
    await bodies.entered()
    await eventually(lambda: _statuses_are(engine, ["ok", "ok"]), what="the second run")


async def _statuses_are(engine: AsyncEngine, statuses: list[str]) -> bool:
    return [row[0] for row in await runs(engine, "long")] == statuses


async def test_a_run_elsewhere_that_ends_before_the_slot_does_not_skip_the_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    """On the real clock: a run of the job in another process (an old leader's thread
    body that outlived its leadership) holds a live running lease, which the leader has
    read (with a change of the row's next slot). That run ends, and its outcome write
    releases the lease, within the claim lead before the slot. Nothing runs at the
    slot, so the slot must run, as it does with claim_ahead_seconds=0, not be recorded
    skipped_overlap by a claim prepared while the lease held."""
    scheduler = Scheduler()

    @scheduler.job(every(seconds=3600), id="hourly")
    async def hourly(ctx: JobContext) -> None:
        return None

    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_until_firing()
    await lease_elsewhere(
        engine,
        "hourly",
        "now() + interval '1 hour'",
        "last_status = 'running'",
        "next_run_at = clock_timestamp() + interval '3 seconds'",
    )

    async def slot_within_the_lead() -> bool:
        async with engine.connect() as conn:
            left = await conn.execute(
                text(
                    "SELECT next_run_at - clock_timestamp() < interval '0.3 seconds'"
                    " FROM scheduler_jobs WHERE id = 'hourly'"
                )
            )
            return bool(left.scalar_one())

    await eventually(slot_within_the_lead, what="the slot within the claim lead")
    # The other process's outcome write, as its release of the lease (before the slot).
    async with engine.begin() as conn:
        released = await conn.execute(
            text(
                "UPDATE scheduler_jobs SET running_run_id = NULL, running_pid = NULL,"
                " running_host = NULL, running_since = NULL, running_until = NULL,"
                " last_status = 'ok' WHERE id = 'hourly' AND running_run_id = 999999"
            )
        )
        assert released.rowcount == 1

    await eventually(lambda: runs_settled(engine, "hourly", 1), what="the slot's run")
    statuses = [status for status, _ in await runs(engine, "hourly")]
    assert statuses == ["ok"], (
        f"a run that ended before the slot left it {statuses}: overlap judged when the "
        "claim was prepared"
    )


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

    # The commit's margin (2 ms, or what a crowd's bodies take to start) is the one
    # window in which a claim is in but its body has not begun, as right after any
    # claim: a loss there is recorded, never silent, and never run twice.
    await eventually(lambda: runs_settled(engine, "minutely", 1), what="the slot's run to end")
    assert [status for status, _ in await runs(engine, "minutely")] == ["cancelled"]
    assert started_first == started_second == []


async def test_a_worker_stopped_between_the_prepared_commit_and_the_slot_records_it_once(
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

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
    clock.set(SLOT - timedelta(milliseconds=1))
    await eventually(
        lambda: _not(prepared_claim_waits(engine)), what="the prepared claim to commit"
    )
    await first.stop()
    await standby.wait_until_firing()
    clock.set(SLOT + timedelta(seconds=1))
    await eventually(lambda: runs_settled(engine, "minutely", 1), what="the slot to be recorded")
    assert await runs(engine, "minutely") == [("cancelled", SLOT)]
    assert started_first == started_second == []
