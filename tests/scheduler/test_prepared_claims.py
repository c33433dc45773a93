"""Claims prepared ahead of their slot: the leader runs a slot's claim statements within
claim_ahead_seconds before it, holds the claimed rows in the open transaction, and
commits just before the slot, so that however many jobs share the slot their bodies
begin at it. Until the commit nothing is claimed: a leadership lost or stepped down
meanwhile leaves the slot to the next leader, and a frozen leader's server session is
ended a second after it should have committed."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, asyncpg_dsn
from app.scheduler import FakeClock, JobContext, Scheduler, SchedulerConfig, cron, every
from app.scheduler.store import JobStore, PreparedClaimDropped, PreparedCommit, SlotClaim

from .conftest import (
    BlockingBodies,
    StartScheduler,
    eventually,
    minutely_recording,
    prepared_claim_waits,
    runs,
)

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
SLOT = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
# Inside the default claim lead (0.5 s) of SLOT.
IN_THE_LEAD = 29.8


async def _next_run_at(engine: AsyncEngine, job_id: str) -> datetime:
    async with engine.connect() as conn:
        moment: datetime = (
            await conn.execute(
                text("SELECT next_run_at FROM scheduler_jobs WHERE id = :id"), {"id": job_id}
            )
        ).scalar_one()
        return moment


async def test_a_claim_prepared_ahead_of_its_slot_commits_nothing_and_starts_no_body_before_it(
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
    assert await _next_run_at(engine, "minutely") == SLOT
    assert await runs(engine, "minutely") == []
    assert started == []

    clock.advance(0.2)
    await eventually(lambda: _run_status_is(engine, "ok"), what="the slot's run")
    assert started == [(SLOT, SLOT)]
    async with engine.connect() as conn:
        run = (await conn.execute(text("SELECT started_at, lateness_ms FROM scheduler_runs"))).one()
    assert (run.started_at, run.lateness_ms) == (SLOT, 0)


async def _run_status_is(engine: AsyncEngine, status: str) -> bool:
    return [row[0] for row in await runs(engine, "minutely")] == [status]


@pytest.mark.parametrize("ending", ["lock connection terminated", "worker stopped"])
async def test_a_leadership_that_ends_before_its_prepared_claim_commits_leaves_the_slot_to_the_next(
    start_scheduler: StartScheduler, engine: AsyncEngine, ending: str
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
    if ending == "worker stopped":
        await first.stop()
    else:
        async with engine.connect() as conn:
            await conn.execute(
                text("SELECT pg_terminate_backend(:pid)"), {"pid": leader.lock.backend_pid}
            )
    await standby.wait_until_firing()

    clock.advance(1)
    await eventually(lambda: _run_status_is(engine, "ok"), what="the slot's run")
    assert started_first == []
    assert [scheduled for scheduled, _ in started_second] == [SLOT]


async def test_a_frozen_leader_does_not_hold_its_prepared_claims_rows_for_long(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    started: list[tuple[datetime, datetime]] = []
    minutely_recording(scheduler, started)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)

    # The clock stops inside the lead: to the server, a process that froze there.
    clock.advance(IN_THE_LEAD)
    await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
    async with engine.begin() as conn:
        # Waits for the claim's row lock until the server ends the idle transaction.
        await conn.execute(text("UPDATE scheduler_jobs SET paused = true WHERE id = 'minutely'"))

    clock.advance(5)
    await eventually(lambda: _leader_ticked_past(engine, SLOT), what="a tick past the slot")
    assert started == []
    assert await runs(engine, "minutely") == []
    async with engine.connect() as conn:
        broken = await conn.execute(text("SELECT count(*) FROM scheduler_broken_jobs"))
        assert broken.scalar_one() == 0


async def _leader_ticked_past(engine: AsyncEngine, moment: datetime) -> bool:
    async with engine.connect() as conn:
        heartbeat = await conn.execute(
            text("SELECT count(*) FROM scheduler_leadership WHERE heartbeat_at >= :after"),
            {"after": moment},
        )
        return bool(heartbeat.scalar_one())


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


def test_a_claim_lead_of_more_than_a_quarter_of_the_lease_is_refused_naming_the_bound() -> None:
    with pytest.raises(ValueError, match=r"claim_ahead_seconds must be between 0 and a quarter"):
        SchedulerConfig(
            lock_dsn="postgresql://x",
            lease_seconds=10,
            leader_tick_seconds=1,
            claim_ahead_seconds=2.6,
        )


async def test_a_prepared_claim_whose_leader_lost_the_key_while_it_waited_claims_nothing(
    database: Database, database_url: str
) -> None:
    store = JobStore(database.engine, pid=4242, host="here", lease_clock=FakeClock(T0))
    scheduler = Scheduler()
    minutely_recording(scheduler, [])
    [row] = (
        await store.register_leader_jobs(scheduler.jobs.values(), T0, ZoneInfo("UTC"))
    ).values()
    holder = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await holder.execute(store.key.call("pg_advisory_lock"), *store.key.args)
        fence_pid = await holder.fetchval("SELECT pg_backend_pid()")

        async def key_lost_meanwhile() -> None:
            # Lost without the leader noticing (a partition): only the fence can tell.
            await holder.execute(store.key.call("pg_advisory_unlock"), *store.key.args)

        prepared = PreparedCommit(row.next_run_at, key_lost_meanwhile, lambda: T0, 1.0)
        item = SlotClaim(
            "minutely",
            row.next_run_at,
            row.next_run_at,
            row.next_run_at + timedelta(minutes=1),
            "running",
            lease_seconds=30,
        )
        with pytest.raises(PreparedClaimDropped):
            await store.claim_many([item], now=T0, fence_pid=fence_pid, prepared=prepared)
    finally:
        await holder.close()
    assert await _next_run_at(database.engine, "minutely") == row.next_run_at
    assert await runs(database.engine, "minutely") == []
