"""Claims prepared ahead of their slot: the leader runs a slot's claim statements within
claim_ahead_seconds before it, holds the claimed rows in the open transaction, and
commits just before the slot, so that however many jobs share the slot their bodies
begin at it. Until the commit nothing is claimed: a leadership lost or stepped down
meanwhile leaves the slot to the next leader, and a frozen leader's server session is
ended a second after it should have committed. An operator's write to a claimed row
during the lead waits for the commit: a pause committed and seen before the slot
starts no body, a run-now is refused (the job runs) or runs, and on a database with a
short lock or statement timeout an admin write never answers 5xx.
When the claim commits and what its slot decides: test_prepared_claim_commit.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, asyncpg_dsn
from app.main import create_app
from app.operations.errors import Conflict
from app.operations.jobs import run_job_now, set_paused
from app.scheduler import FakeClock, JobContext, Role, Scheduler, SchedulerConfig, cron, every
from app.scheduler.store import JobStore, PreparedClaimDropped, PreparedCommit, SlotClaim
from app.settings import Settings

from .conftest import (
    StartScheduler,
    eventually,
    minutely_recording,
    prepared_claim_waits,
    runs,
    runs_settled,
)

T0 = datetime(2026, 1, 1, 0, 0, 30, tzinfo=UTC)
SLOT = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)
# Inside the default claim lead (0.5 s) of SLOT.
IN_THE_LEAD = 29.8
TOKEN = "s3cret-admin-token-for-prepared-claims"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


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
    clock = FakeClock(T0)
    store = JobStore(database.engine, pid=4242, host="here", lease_clock=clock)
    scheduler = Scheduler()
    minutely_recording(scheduler, [])
    [row] = (
        await store.register_leader_jobs(scheduler.jobs.values(), T0, ZoneInfo("UTC"))
    ).values()
    holder = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await holder.execute(store.key.call("pg_advisory_lock"), *store.key.args)
        fence_pid = await holder.fetchval("SELECT pg_backend_pid()")

        prepared = PreparedCommit(row.next_run_at, T0 + timedelta(seconds=1), clock, 1.0)
        item = SlotClaim(
            "minutely",
            row.next_run_at,
            row.next_run_at,
            row.next_run_at + timedelta(minutes=1),
            "running",
            lease_seconds=30,
        )
        claim = asyncio.ensure_future(
            store.claim_many([item], now=T0, fence_pid=fence_pid, prepared=prepared)
        )
        # The claim waits for its commit; meanwhile the key is lost without the leader
        # noticing (a partition): only the fence can tell.
        await clock.wait_for_sleepers(1, timeout=10)
        await holder.execute(store.key.call("pg_advisory_unlock"), *store.key.args)
        clock.advance(1)
        with pytest.raises(PreparedClaimDropped):
            await claim
    finally:
        await holder.close()
    assert await _next_run_at(database.engine, "minutely") == row.next_run_at
    assert await runs(database.engine, "minutely") == []


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
        timer = None if supervisor.leading is None else supervisor.leading.timer
        row = None if timer is None else timer.rows.get("minutely")
        return row is not None and row.paused

    # The pause is committed, and the leader has read it (its NOTIFY reload), before the slot.
    await eventually(leader_saw_the_pause, what="the leader to see the pause")
    assert clock.now() < SLOT
    clock.set(SLOT + timedelta(seconds=1))

    async def no_body_left() -> bool:
        timer = None if supervisor.leading is None else supervisor.leading.timer
        return timer is None or not timer.bodies

    await eventually(no_body_left, what="the slot's body to end")
    assert started == [], "a body started after its job's pause was committed and seen"


def _blocking_minutely(
    scheduler: Scheduler, started: list[tuple[datetime, bool]], release: asyncio.Event
) -> None:
    @scheduler.job(cron("* * * * *"), id="minutely")
    async def minutely(ctx: JobContext) -> None:
        started.append((ctx.scheduled_at, False))
        await release.wait()


async def test_a_run_now_asked_during_the_lead_is_refused_or_runs(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    started: list[tuple[datetime, bool]] = []
    release = asyncio.Event()
    _blocking_minutely(scheduler, started, release)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)

    clock.advance(IN_THE_LEAD)
    await eventually(lambda: prepared_claim_waits(engine), what="a prepared claim")
    # The operator asks for a run now 0.2 s before the slot: the job is not running
    # (nothing committed yet), so the request is accepted (no Conflict).
    asking = asyncio.create_task(run_job_now(engine, "minutely", lease_now=clock.now()))
    await eventually(lambda: _a_statement_waits_for_a_row_lock(engine), what="the request")
    clock.set(SLOT)
    try:
        await asyncio.wait_for(asking, 10)
    except Conflict:
        # Told at once that the job runs (its request waited for the claim's commit).
        release.set()
        clock.advance(1)
        await eventually(lambda: runs_settled(engine, "minutely", 1), what="the slot's run to end")
        assert await runs(engine, "minutely") == [("ok", SLOT)]
        return
    await eventually(lambda: _has_runs(engine, 2), what="two run rows")
    release.set()
    clock.advance(1)
    await eventually(lambda: runs_settled(engine, "minutely", 2), what="both runs to end")
    statuses = [s for s, _ in await runs(engine, "minutely")]
    assert statuses == ["ok", "ok"], f"an accepted run-now request did not run: {statuses}"


async def _has_runs(engine: AsyncEngine, count: int) -> bool:
    return len(await runs(engine, "minutely")) >= count


@pytest.fixture(params=["lock_timeout", "statement_timeout"])
async def admin_on_a_database_with_a_timeout(
    request: pytest.FixtureRequest, settings: Settings, engine: AsyncEngine, database_url: str
) -> AsyncIterator[httpx.AsyncClient]:
    """The app from Settings (claims prepared ahead by the default lead), on a database
    whose lock_timeout or statement_timeout (200 ms, a common DBA setting, shorter than
    the lead) every app connection inherits, with a job due every two seconds."""
    name = make_url(database_url).database
    async with engine.begin() as conn:
        await conn.execute(text(f"ALTER DATABASE \"{name}\" SET {request.param} = '200ms'"))
    scheduler = Scheduler()

    @scheduler.job(every(seconds=2), id="often")
    async def often(ctx: JobContext) -> None:
        return None

    app: FastAPI = create_app(
        settings.model_copy(update={"ADMIN_TOKEN": SecretStr(TOKEN)}), scheduler
    )
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.LEADER)
        await scheduler.supervisor.wait_until_firing()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.mark.parametrize("action", ["pause", "run"])
async def test_an_admin_write_during_a_prepared_claim_never_answers_5xx(
    admin_on_a_database_with_a_timeout: httpx.AsyncClient, engine: AsyncEngine, action: str
) -> None:
    client = admin_on_a_database_with_a_timeout
    await eventually(lambda: prepared_claim_waits(engine), 10, "a claim prepared ahead")
    response = await client.post(f"/admin/api/jobs/often/{action}", headers=AUTH)
    assert response.status_code < 500, (
        f"{action} during a prepared claim answered {response.status_code}: {response.text}"
    )
