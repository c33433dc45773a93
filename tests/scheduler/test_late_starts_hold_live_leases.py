"""A body that starts late after its claim took its running lease still holds a live
lease, renewed in time: the first renewal of a body's lease is due a third of a lease
after it was taken. A claim prepared ahead that commits late gives its bodies a whole
lease from the commit, as every other claim does from its start; a body that starts a
renewal period or more after its claim took its lease (a process that froze, a clock
that jumped, while the claim was under way), within its start window, has it renewed
at once. Otherwise the lease
would run out, or stay run out, while the body runs, and another claim could take the
job from it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, Scheduler, SchedulerConfig, SystemClock, cron
from app.scheduler.store import ClaimedSlot, JobStore, PreparedCommit, SlotClaim

from .conftest import BlockingBodies, StartScheduler, eventually, prepared_claim_waits

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
SLOT = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
# Inside the claim lead (0.5 s) of SLOT.
IN_THE_LEAD = 29.8


async def _a_statement_waits_for_a_row_lock(engine: AsyncEngine) -> bool:
    async with engine.connect() as conn:
        waiting = await conn.execute(
            text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        )
        return bool(waiting.scalar_one())


async def _running_until(engine: AsyncEngine) -> datetime:
    async with engine.connect() as conn:
        until: datetime = (
            await conn.execute(text("SELECT running_until FROM scheduler_jobs WHERE id = 'held'"))
        ).scalar_one()
        return until


async def test_a_prepared_claim_that_commits_late_gives_its_body_a_whole_lease_from_the_commit(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    bodies: BlockingBodies,
    config: SchedulerConfig,
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(cron("* * * * *"), id="held")(bodies)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
    # The wake comes 0.8 s past the slot (a busy loop), within the server's idle limit.
    committed = SLOT + timedelta(seconds=0.8)
    clock.set(committed)
    await bodies.entered()

    assert await _running_until(engine) == committed + timedelta(seconds=config.lease_seconds)


async def test_on_the_servers_clock_a_late_prepared_commit_gives_a_whole_lease_from_the_commit(
    database: Database,
) -> None:
    # The production lease clock (the database server's): the claim takes the lease as
    # of the server's moment of the slot, and its commit comes late.
    store = JobStore(database.engine, pid=4242, host="here")
    clock = SystemClock()
    scheduler = Scheduler()
    scheduler.job(cron("* * * * *"), id="held")(lambda ctx: None)
    [row] = (
        await store.register_leader_jobs(scheduler.jobs.values(), clock.now(), ZoneInfo("UTC"))
    ).values()
    late = 1.5
    # Planned to start at once, it commits 1.5 s later (a busy loop); the server's idle
    # limit is the plan plus a few seconds.
    prepared = PreparedCommit(clock.now(), clock.now() + timedelta(seconds=late), clock, 0.0)
    item = SlotClaim(
        "held",
        row.next_run_at,
        row.next_run_at,
        row.next_run_at + timedelta(minutes=1),
        "running",
        lease_seconds=30,
    )
    [claimed] = await store.claim_many([item], now=clock.now(), fence_pid=None, prepared=prepared)
    assert isinstance(claimed, ClaimedSlot) and claimed.status == "running"

    async with database.engine.connect() as conn:
        left = (
            await conn.execute(
                text(
                    "SELECT EXTRACT(EPOCH FROM running_until - clock_timestamp())"
                    " FROM scheduler_jobs WHERE id = 'held'"
                )
            )
        ).scalar_one()
    # A lease from the slot would have 30 - 1.5 s left; one from the commit nearly 30.
    assert left > 30 - late / 2


async def test_a_body_that_starts_a_renewal_period_after_its_claim_took_its_lease_has_it_renewed(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    bodies: BlockingBodies,
    config: SchedulerConfig,
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(cron("* * * * *"), id="held")(bodies)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)

    async with engine.connect() as holder:
        # Another transaction holds the run table: the slot's claim, made at the slot
        # (its lease taken as of it), waits to record its run. (A job row held
        # elsewhere would not do: the claim skips such a row and claims it later.)
        await holder.execute(text("LOCK TABLE scheduler_runs IN EXCLUSIVE MODE"))
        clock.set(SLOT)
        await eventually(
            lambda: _a_statement_waits_for_a_row_lock(engine), what="the claim to wait"
        )
        # Meanwhile everything freezes for half a lease (the test's clock jumps): more
        # than a renewal period, within the body's start window (one past it never
        # starts: test_no_body_starts_past_its_lease.py).
        clock.advance(config.lease_seconds / 2)
        await holder.rollback()
    await bodies.entered()

    async def lease_is_renewed() -> bool:
        # A whole lease from now (the claim's lease, taken as of the slot, ends sooner).
        renewed = clock.now() + timedelta(seconds=config.lease_seconds)
        return await _running_until(engine) >= renewed

    # Renewed without the clock moving on: not a renewal period after the body began.
    await eventually(lease_is_renewed, what="the body's lease to be renewed")
    assert await _running_until(engine) == clock.now() + timedelta(seconds=config.lease_seconds)
