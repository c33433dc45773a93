"""A job's own commit carries a fence: no commit of a body whose leadership was
superseded lands after the new leadership began.

A body may outlive its leader's lock (a thread cannot be cancelled; an async body runs
until its leader notices). Every promotion moves the leadership term, and
``ctx.fence(session)`` / ``ctx.fence_sync(session)`` make the job's transaction fail
when the term moved since its run was claimed; the promotion waits for a fenced
transaction already under way, for a leader tick, then ends it.

The fence takes the term row FOR KEY SHARE and a promotion locks it FOR UPDATE before
its bump: a fenced commit of an old leadership never lands after a new leadership
began, whatever the job's isolation level and whatever heartbeats wrote the row
meanwhile.
"""

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db import Database
from app.scheduler import FakeClock, JobContext, Role, Scheduler, every
from app.scheduler.errors import LeadershipLostError
from app.scheduler.supervisor import Supervisor
from app.testing import run_job

from ..conftest import promote_elsewhere
from .conftest import StartScheduler, eventually, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# Long enough that no clock step in these tests outruns the running lease by itself.
LEASE = 30
INSERT = text("INSERT INTO fenced_effects (slot) VALUES (:slot)")
# The leader's heartbeat, as its tick writes the term row.
_HEARTBEAT = text("UPDATE scheduler_leadership SET heartbeat_at = clock_timestamp()")
Effects = Callable[[], Awaitable[list[datetime]]]


@pytest.fixture
async def effects(engine: AsyncEngine) -> Effects:
    """A table the jobs write their slot to; returns a reader of the committed slots."""
    async with engine.begin() as conn:
        await conn.execute(text("CREATE TABLE fenced_effects (slot timestamptz PRIMARY KEY)"))

    async def committed() -> list[datetime]:
        async with engine.connect() as conn:
            rows = await conn.execute(text("SELECT slot FROM fenced_effects ORDER BY slot"))
            return list(rows.scalars())

    return committed


class HeldBody:
    """A thread job whose first body waits for ``release`` at ``hold`` ("before" its
    fenced transaction, or "inside" it, after the fence); later bodies do not wait."""

    def __init__(self, hold: str) -> None:
        self.hold = hold
        self.entered = threading.Event()
        self.release = threading.Event()
        self._calls = 0

    def __call__(self, ctx: JobContext) -> None:
        self._calls += 1
        first = self._calls == 1
        if first and self.hold == "before":
            self._wait()
        session = ctx.sync_session
        ctx.fence_sync(session)
        session.execute(INSERT, {"slot": ctx.scheduled_at})
        if first and self.hold == "inside":
            self._wait()

    def _wait(self) -> None:
        self.entered.set()
        self.release.wait(30)


def _scheduler(body: HeldBody) -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(seconds=10), id="fenced")(body)
    return scheduler


async def _first_leader_with_body_held(
    start_scheduler: StartScheduler, body: HeldBody, clock: FakeClock
) -> Supervisor:
    first = await start_scheduler(_scheduler(body), clock=clock, lease_seconds=LEASE)
    await first.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    assert await asyncio.to_thread(body.entered.wait, 10), "the first body never started"
    # Parked again (tick, job loop, lease renewal): no statement is in flight on the
    # lock connection when the test terminates it.
    await clock.wait_for_sleepers(3)
    return first


async def _terminate_lock_connection(engine: AsyncEngine, supervisor: Supervisor) -> None:
    assert supervisor.lock is not None
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT pg_terminate_backend(:pid)"), {"pid": supervisor.lock.backend_pid}
        )


async def _promote_a_second_leader(
    start_scheduler: StartScheduler, engine: AsyncEngine, body: HeldBody, clock: FakeClock
) -> Supervisor:
    """The first leader's body is held; the first loses its lock; a second promotes."""
    first = await _first_leader_with_body_held(start_scheduler, body, clock)
    second = await start_scheduler(_scheduler(body), clock=clock, lease_seconds=LEASE)
    await second.wait_for_role(Role.STANDBY)
    await _terminate_lock_connection(engine, first)
    await second.wait_until_firing()
    return second


def _recording_waits(engine: AsyncEngine, supervisor: Supervisor) -> Callable[[], Awaitable[bool]]:
    """A condition: the supervisor's promotion record waits on the term's row lock."""

    async def waits() -> bool:
        lock = supervisor.lock
        if lock is None:
            return False
        async with engine.connect() as conn:
            # Its promotion's record, waiting on a row lock (not the advisory key).
            waiting = await conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"
                    " AND wait_event_type = 'Lock' AND wait_event <> 'advisory'"
                    " AND query LIKE '%scheduler_leadership%'"
                ),
                {"pid": lock.backend_pid},
            )
            return bool(waiting.scalar_one() == 1)

    return waits


async def _term(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        term: int = (await conn.execute(text("SELECT term FROM scheduler_leadership"))).scalar_one()
        return term


async def test_a_body_that_outlives_its_leadership_cannot_commit_after_a_new_promotion(
    start_scheduler: StartScheduler, engine: AsyncEngine, effects: Effects
) -> None:
    clock = FakeClock(T0)
    body = HeldBody(hold="before")
    await _promote_a_second_leader(start_scheduler, engine, body, clock)
    body.release.set()
    [(status, slot)] = await wait_for_runs(engine, "fenced", 1)
    assert (status, slot) == ("error", T0 + timedelta(seconds=10))
    async with engine.connect() as conn:
        error = (await conn.execute(text("SELECT error FROM scheduler_runs"))).scalar_one()
    assert "LeadershipLostError" in error and "not committed" in error
    assert await effects() == []


async def test_the_new_leaders_run_of_the_next_slot_commits(
    start_scheduler: StartScheduler, engine: AsyncEngine, effects: Effects
) -> None:
    clock = FakeClock(T0)
    body = HeldBody(hold="before")
    await _promote_a_second_leader(start_scheduler, engine, body, clock)
    body.release.set()
    await wait_for_runs(engine, "fenced", 1)
    # Parked: the new leader's tick and job loop.
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    history = await wait_for_runs(engine, "fenced", 2)
    assert history[1] == ("ok", T0 + timedelta(seconds=20))
    assert await effects() == [T0 + timedelta(seconds=20)]


async def test_a_promotion_waits_for_a_fenced_commit_under_way(
    start_scheduler: StartScheduler, engine: AsyncEngine, effects: Effects
) -> None:
    clock = FakeClock(T0)
    body = HeldBody(hold="inside")
    first = await _first_leader_with_body_held(start_scheduler, body, clock)
    term = await _term(engine)
    second = await start_scheduler(_scheduler(body), clock=clock, lease_seconds=LEASE)
    await second.wait_for_role(Role.STANDBY)
    await _terminate_lock_connection(engine, first)
    await eventually(_recording_waits(engine, second), what="the term bump to wait")
    assert not second.firing
    assert await _term(engine) == term
    body.release.set()
    await second.wait_until_firing()
    assert await wait_for_runs(engine, "fenced", 1) == [("ok", T0 + timedelta(seconds=10))]
    assert await effects() == [T0 + timedelta(seconds=10)]
    assert await _term(engine) == term + 1


async def test_a_promotion_ends_a_fenced_transaction_still_open_after_a_tick_and_it_never_lands(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    effects: Effects,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The old leader's process may be hung (SIGSTOP) with its fenced transaction open:
    the promotion waits a leader tick for it, then ends it, so the new term begins and
    that transaction's commit never lands."""
    clock = FakeClock(T0)
    body = HeldBody(hold="inside")
    first = await _first_leader_with_body_held(start_scheduler, body, clock)
    term = await _term(engine)
    second = await start_scheduler(_scheduler(body), clock=clock, lease_seconds=LEASE)
    await second.wait_for_role(Role.STANDBY)
    await _terminate_lock_connection(engine, first)
    await eventually(_recording_waits(engine, second), what="the term bump to wait")
    clock.advance(second.config.leader_tick_seconds)
    await second.wait_until_firing()
    assert await _term(engine) == term + 1
    assert "scheduler.old_term_transaction_ended" in caplog.text
    body.release.set()
    [(status, _)] = await wait_for_runs(engine, "fenced", 1)
    assert (status, await effects()) == ("error", [])


async def test_a_fenced_transaction_held_open_does_not_stall_the_leaders_tick(
    start_scheduler: StartScheduler, engine: AsyncEngine, effects: Effects
) -> None:
    """The tick's heartbeat writes the row a fenced transaction holds: were it to wait,
    the tick would stop (no reload, no lock check) for as long as a job keeps a fenced
    transaction open, and past the lease the server would end the lock connection."""
    clock = FakeClock(T0)
    body = HeldBody(hold="inside")
    await _first_leader_with_body_held(start_scheduler, body, clock)
    clock.advance(1)

    async def beat() -> bool:
        async with engine.connect() as conn:
            at = await conn.execute(text("SELECT heartbeat_at FROM scheduler_leadership"))
            return bool(at.scalar_one() >= T0 + timedelta(seconds=11))

    try:
        await eventually(beat, 5, "the tick's heartbeat beside the fenced transaction")
    finally:
        body.release.set()
    assert await wait_for_runs(engine, "fenced", 1) == [("ok", T0 + timedelta(seconds=10))]
    assert await effects() == [T0 + timedelta(seconds=10)]


async def test_an_async_body_whose_term_moved_commits_nothing(
    database: Database, database_url: str, effects: Effects
) -> None:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="fenced_async")
    async def fenced_async(ctx: JobContext) -> None:
        await ctx.session.execute(INSERT, {"slot": ctx.scheduled_at})
        # A new leader promoted while this body ran (its own leader had not noticed yet).
        await promote_elsewhere(database_url)
        await ctx.fence(ctx.session)

    record = await run_job(scheduler, "fenced_async", database=database, at=T0)
    assert record.status == "error"
    assert record.error is not None and "LeadershipLostError" in record.error
    assert await effects() == []


async def test_a_promotion_waiting_for_a_fenced_commit_stops_when_told(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    effects: Effects,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(T0)
    body = HeldBody(hold="inside")
    first = await _first_leader_with_body_held(start_scheduler, body, clock)
    term = await _term(engine)
    scheduler = _scheduler(body)
    second = await start_scheduler(scheduler, clock=clock, lease_seconds=LEASE)
    await second.wait_for_role(Role.STANDBY)
    await _terminate_lock_connection(engine, first)
    await eventually(_recording_waits(engine, second), what="the term bump to wait")
    await scheduler.stop()
    assert second.role is Role.STOPPED
    # It stopped on its own, not cancelled after the stop timeout.
    assert "did not stop within" not in caplog.text
    assert await _term(engine) == term
    body.release.set()
    assert await wait_for_runs(engine, "fenced", 1) == [("ok", T0 + timedelta(seconds=10))]


async def test_the_fence_of_a_per_worker_job_names_the_job_and_the_fix(
    database: Database, effects: Effects
) -> None:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="sweep", leader_only=False)
    async def sweep(ctx: JobContext) -> None:
        await ctx.session.execute(INSERT, {"slot": ctx.scheduled_at})
        await ctx.fence(ctx.session)

    record = await run_job(scheduler, "sweep", database=database, at=T0)
    assert record.status == "error"
    assert record.error is not None
    assert 'job "sweep" runs on every worker (leader_only=False)' in record.error
    assert "make the job leader_only" in record.error
    assert await effects() == []


def _ctx(term: int) -> JobContext:
    return JobContext(
        job_id="money",
        name="money",
        scheduled_at=T0,
        clock=FakeClock(T0),
        log=logging.LoggerAdapter(logging.getLogger("test")),
        term=term,
    )


async def _repeatable_read(database: Database) -> AsyncSession:
    session = database.sessions()
    await session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    # The transaction's snapshot: the body read something before it fenced.
    await session.execute(text("SELECT 1"))
    return session


async def test_a_repeatable_read_body_cannot_pass_the_fence_after_a_new_promotion(
    database: Database, database_url: str
) -> None:
    term = await promote_elsewhere(database_url)
    session = await _repeatable_read(database)
    try:
        await promote_elsewhere(database_url)
        with pytest.raises((LeadershipLostError, DBAPIError)):
            await _ctx(term).fence(session)
    finally:
        await session.close()


async def test_a_repeatable_read_body_passes_the_fence_when_only_heartbeats_wrote_the_row(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    """The leader's tick rewrites the term row every tick (its heartbeat). A fenced job
    transaction under repeatable read whose snapshot predates a heartbeat is still of the
    current leadership: its fence passes (FOR SHARE failed it to serialize)."""
    term = await promote_elsewhere(database_url)
    session = await _repeatable_read(database)
    try:
        async with engine.begin() as conn:
            await conn.execute(_HEARTBEAT)
        await _ctx(term).fence(session)
        await session.commit()
    finally:
        await session.close()


async def test_a_repeatable_read_body_cannot_pass_the_fence_after_a_heartbeat_and_a_promotion(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    """The snapshot's version of the row was replaced by a heartbeat (a non-key update),
    and the heartbeat's version by the promotion's bump."""
    term = await promote_elsewhere(database_url)
    session = await _repeatable_read(database)
    try:
        async with engine.begin() as conn:
            await conn.execute(_HEARTBEAT)
        await promote_elsewhere(database_url)
        with pytest.raises((LeadershipLostError, DBAPIError)):
            await _ctx(term).fence(session)
    finally:
        await session.close()


async def test_a_fence_taken_beside_a_heartbeat_under_way_still_holds_off_the_promotion(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    term = await promote_elsewhere(database_url)
    async with engine.connect() as beat:
        await beat.execute(_HEARTBEAT)  # open: the heartbeat is under way
        session = database.sessions()
        try:
            await asyncio.wait_for(_ctx(term).fence(session), 5)
            await beat.commit()
            async with engine.begin() as conn:
                await conn.execute(_HEARTBEAT)
            promotion = asyncio.ensure_future(promote_elsewhere(database_url))
            done, _ = await asyncio.wait({promotion}, timeout=2)
            assert not done, "the promotion did not wait for the fenced transaction"
            await session.commit()
            assert await asyncio.wait_for(promotion, 5) == term + 1
        finally:
            await session.close()


async def test_a_fence_taken_while_the_promotion_waits_cannot_commit_after_it(
    database: Database, database_url: str
) -> None:
    """The promotion waits for a first fenced transaction; a second fence arrives while
    it waits (KEY SHARE beside KEY SHARE does not queue behind the FOR UPDATE)."""
    term = await promote_elsewhere(database_url)
    first, second = database.sessions(), database.sessions()
    try:
        await _ctx(term).fence(first)
        promotion = asyncio.ensure_future(promote_elsewhere(database_url))
        done, _ = await asyncio.wait({promotion}, timeout=1)
        assert not done
        try:
            await asyncio.wait_for(_ctx(term).fence(second), 2)
        except (LeadershipLostError, TimeoutError):
            second_passed = False
        else:
            second_passed = True
        await first.commit()
        if second_passed:
            done, _ = await asyncio.wait({promotion}, timeout=2)
            assert not done, "the promotion ended while a fenced transaction was open"
            await second.commit()
        assert await asyncio.wait_for(promotion, 10) == term + 1
    finally:
        await first.close()
        await second.close()


async def test_a_promotion_under_a_repeatable_read_default_survives_a_heartbeat_while_it_waits(
    database: Database, database_url: str, engine: AsyncEngine
) -> None:
    """Under ``default_transaction_isolation = 'repeatable read'`` (a setup the scheduler
    supports) the promotion's record waits for a fenced transaction; meanwhile the old
    leader's tick beats (its UPDATE no longer waits for the fence). When the fenced
    transaction ends, the promotion must still begin its term."""
    term = await promote_elsewhere(database_url)
    async with engine.connect() as conn:
        name = (await conn.execute(text("SELECT current_database()"))).scalar_one()
    async with engine.connect() as conn:
        await conn.execution_options(isolation_level="AUTOCOMMIT")
        await conn.execute(
            text(f"ALTER DATABASE \"{name}\" SET default_transaction_isolation = 'repeatable read'")
        )
    await engine.dispose()
    session = database.sessions()
    try:
        await _ctx(term).fence(session)
        promotion = asyncio.ensure_future(promote_elsewhere(database_url))
        done, _ = await asyncio.wait({promotion}, timeout=1)
        assert not done, "the promotion did not wait for the fenced transaction"
        # The old leader's heartbeat, as its tick writes it, lands beside the waiting bump.
        async with engine.begin() as conn:
            await asyncio.wait_for(conn.execute(_HEARTBEAT), 5)
        await session.commit()
        assert await asyncio.wait_for(promotion, 5) == term + 1
    finally:
        await session.close()
