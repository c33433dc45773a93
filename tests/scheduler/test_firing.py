"""Firing: slots claimed before they run, at most once, across restarts and outages."""

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Role, Scheduler, cron, every
from app.scheduler.errors import JobRowBusyError
from app.scheduler.registry import JobSpec
from app.scheduler.runner import Claim, Runner
from app.scheduler.store import JobStore
from app.scheduler.supervisor import Supervisor
from app.scheduler.triggers import COUNTED_SLOTS
from app.testing.claims import claim_leader

from .conftest import StartScheduler, make_runner, runs, wait_for_runs

UTC_ZONE = ZoneInfo("UTC")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _leading(
    start_scheduler: StartScheduler, scheduler: Scheduler, clock: FakeClock
) -> Supervisor:
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_for_role(Role.LEADER)
    # Parked: the leader tick and the job timer.
    await clock.wait_for_sleepers(2)
    return supervisor


async def _claim_or_lose(runner: Runner, spec: JobSpec, due: datetime) -> Claim | None:
    """The runner's claim of slot ``due``; None when it lost the race: the other
    claim matched first, or held the row when this one came (left out as busy)."""
    try:
        return await claim_leader(runner, spec, due, None)
    except JobRowBusyError:
        return None


async def test_two_leaders_forced_at_once_fire_each_slot_once(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    fired: list[datetime] = []
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="contested")
    async def contested(ctx: JobContext) -> None:
        fired.append(ctx.scheduled_at)

    spec = scheduler.jobs["contested"]
    first, second = make_runner(database, clock, 1), make_runner(database, clock, 2)
    await first.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    due = T0 + timedelta(seconds=10)
    for _ in range(5):
        clock.set(due)
        claims = await asyncio.gather(
            _claim_or_lose(first, spec, due), _claim_or_lose(second, spec, due)
        )
        won = [claim for claim in claims if claim is not None]
        assert len(won) == 1
        runner = first if claims[0] is not None else second
        await runner.execute(spec, won[0])
        due = won[0].next_slot
    assert fired == [T0 + timedelta(seconds=10 * n) for n in range(1, 6)]
    assert [status for status, _ in await runs(engine, "contested")] == ["ok"] * 5


async def test_claim_fenced_by_a_key_not_held_matches_nothing(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(seconds=10), id="fenced")(lambda ctx: None)
    spec = scheduler.jobs["fenced"]
    runner = make_runner(database, clock, 1)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    clock.advance(10)
    async with engine.connect() as conn:
        own_pid = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one()
    assert await claim_leader(runner, spec, rows["fenced"].next_run_at, own_pid) is None
    assert await runs(engine, "fenced") == []


async def test_interval_countdown_survives_a_restart(database: Database) -> None:
    spec = JobSpec(id="hourly", name="Hourly", func=lambda ctx: None, trigger=every(hours=1))
    store = JobStore(database.engine, pid=1, host="test")
    first = await store.register_leader_jobs([spec], T0, UTC_ZONE)
    restarted = await store.register_leader_jobs([spec], T0 + timedelta(minutes=50), UTC_ZONE)
    assert first["hourly"].next_run_at == T0 + timedelta(hours=1)
    assert restarted["hourly"].next_run_at == T0 + timedelta(hours=1)


async def test_changed_trigger_resets_the_countdown(database: Database) -> None:
    store = JobStore(database.engine, pid=1, host="test")
    hourly = JobSpec(id="job", name="Job", func=lambda ctx: None, trigger=every(hours=1))
    await store.register_leader_jobs([hourly], T0, UTC_ZONE)
    minutely = JobSpec(id="job", name="Job", func=lambda ctx: None, trigger=every(minutes=1))
    rows = await store.register_leader_jobs([minutely], T0 + timedelta(minutes=10), UTC_ZONE)
    assert rows["job"].next_run_at == T0 + timedelta(minutes=11)


async def test_first_run_brings_a_job_forward_after_boot(database: Database) -> None:
    store = JobStore(database.engine, pid=1, host="test")
    spec = JobSpec(
        id="warm", name="Warm", func=lambda ctx: None, trigger=every(hours=1), first_run=30
    )
    rows = await store.register_leader_jobs([spec], T0, UTC_ZONE)
    assert rows["warm"].next_run_at == T0 + timedelta(seconds=30)


async def test_first_run_applies_once_per_job_row_not_at_each_promotion(
    database: Database,
) -> None:
    clock = FakeClock(T0)
    spec = JobSpec(
        id="warm", name="Warm", func=lambda ctx: None, trigger=every(hours=1), first_run=30
    )
    runner = make_runner(database, clock, 1)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    clock.advance(30)
    claim = await claim_leader(runner, spec, rows["warm"].next_run_at, None)
    assert claim is not None and claim.next_slot == T0 + timedelta(hours=1, seconds=30)
    # Later promotions and restarts (every 60 s while unguarded) keep the countdown.
    for _ in range(5):
        clock.advance(60)
        rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
        assert rows["warm"].next_run_at == claim.next_slot


async def test_outage_coalesces_missed_slots_into_one_run(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    slots: list[datetime] = []
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="coalesced")
    async def coalesced(ctx: JobContext) -> None:
        slots.append(ctx.scheduled_at)

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(timedelta(seconds=95))
    history = await wait_for_runs(engine, "coalesced", 1)
    assert slots == [T0 + timedelta(seconds=90)]
    assert history == [("ok", T0 + timedelta(seconds=90))]


async def test_slots_later_than_the_grace_are_recorded_missed(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    ran = asyncio.Event()

    @scheduler.job(every(seconds=10), id="graced", misfire_grace=3)
    async def graced(ctx: JobContext) -> None:
        ran.set()

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(timedelta(seconds=95))
    history = await wait_for_runs(engine, "graced", 1)
    assert history == [("missed", T0 + timedelta(seconds=90))]
    assert not ran.is_set()


async def test_a_long_cron_outage_is_caught_up_at_once_and_noted_as_at_least(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(cron("* * * * *", tz="Europe/Zurich"), id="minutely", misfire_grace=3600)(
        lambda ctx: None
    )
    spec = scheduler.jobs["minutely"]
    runner = make_runner(database, clock, 1)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    clock.advance(timedelta(days=30, seconds=30).total_seconds())
    claim = await claim_leader(runner, spec, rows["minutely"].next_run_at, None)
    assert claim is not None
    assert claim.slot == T0 + timedelta(days=30)
    missed = "SELECT error FROM scheduler_runs WHERE job_id = 'minutely' AND status = 'missed'"
    async with engine.connect() as conn:
        note = (await conn.execute(text(missed))).scalar_one()
    assert note.startswith(f"at least {COUNTED_SLOTS} slot(s) ")


async def test_raising_job_is_recorded_and_its_next_slot_fires(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    calls = 0

    @scheduler.job(every(seconds=10), id="flaky")
    async def flaky(ctx: JobContext) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("receiver down")

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(10)
    await wait_for_runs(engine, "flaky", 1)
    clock.advance(10)
    history = await wait_for_runs(engine, "flaky", 2)
    assert [status for status, _ in history] == ["error", "ok"]
    async with engine.connect() as conn:
        error = (
            await conn.execute(
                text("SELECT error FROM scheduler_runs WHERE job_id = 'flaky' ORDER BY id LIMIT 1")
            )
        ).scalar_one()
    assert "RuntimeError: receiver down" in error
    assert "Traceback" in error


async def test_async_job_past_its_timeout_is_cancelled(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    cancelled = asyncio.Event()

    @scheduler.job(every(seconds=60), id="hangs", timeout=0.2)
    async def hangs(ctx: JobContext) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(60)
    history = await wait_for_runs(engine, "hangs", 1)
    assert history[0][0] == "timeout"
    assert cancelled.is_set()


async def test_thread_job_past_its_timeout_blocks_its_next_run_until_it_ends(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    release = threading.Event()
    entered = threading.Semaphore(0)

    @scheduler.job(every(seconds=10), id="slow_thread", timeout=0.1)
    def slow_thread(ctx: JobContext) -> None:
        entered.release()
        release.wait(30)

    supervisor = await _leading(start_scheduler, scheduler, clock)
    clock.advance(10)
    history = await wait_for_runs(engine, "slow_thread", 1)
    assert history[0][0] == "timeout"
    clock.advance(10)
    history = await wait_for_runs(engine, "slow_thread", 2)
    assert history[1][0] == "skipped_overlap"
    release.set()
    async with asyncio.timeout(10):
        while "slow_thread" in supervisor.running_job_ids:
            await asyncio.sleep(0.01)
    clock.advance(10)
    history = await wait_for_runs(engine, "slow_thread", 3)
    assert history[2] == ("ok", T0 + timedelta(seconds=30))
    assert entered.acquire(timeout=0) and entered.acquire(timeout=0)


async def test_thread_job_that_raises_after_its_timeout_is_logged(
    start_scheduler: StartScheduler, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    release = threading.Event()

    @scheduler.job(every(seconds=10), id="late_raiser", timeout=0.1)
    def late_raiser(ctx: JobContext) -> None:
        release.wait(30)
        raise RuntimeError("failed after the timeout")

    supervisor = await _leading(start_scheduler, scheduler, clock)
    clock.advance(10)
    assert (await wait_for_runs(engine, "late_raiser", 1))[0][0] == "timeout"
    release.set()
    async with asyncio.timeout(10):
        while "late_raiser" in supervisor.running_job_ids:
            await asyncio.sleep(0.01)
    assert "failed after the timeout" in caplog.text


async def test_sync_job_runs_in_a_thread_not_on_the_loop(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    loop_thread = threading.get_ident()
    job_threads: list[int] = []

    @scheduler.job(every(seconds=10), id="sync_job")
    def sync_job(ctx: JobContext) -> None:
        job_threads.append(threading.get_ident())
        ctx.sync_session.execute(text("SELECT 1"))

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(10)
    assert (await wait_for_runs(engine, "sync_job", 1))[0][0] == "ok"
    assert job_threads and job_threads[0] != loop_thread


async def test_one_second_sync_job_keeps_loop_lag_under_50_ms(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    started = threading.Event()

    @scheduler.job(every(seconds=10), id="blocking")
    def blocking(ctx: JobContext) -> None:
        started.set()
        time.sleep(1)

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(10)
    await asyncio.to_thread(started.wait, 10)
    worst = 0.0
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        before = time.perf_counter()
        await asyncio.sleep(0.01)
        worst = max(worst, time.perf_counter() - before - 0.01)
    await wait_for_runs(engine, "blocking", 1)
    assert worst < 0.05


async def test_paused_job_does_not_fire(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    ran = asyncio.Event()

    @scheduler.job(every(seconds=10), id="paused")
    async def paused(ctx: JobContext) -> None:
        ran.set()

    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_for_role(Role.LEADER)
    await clock.wait_for_sleepers(2)
    async with engine.begin() as conn:
        await conn.execute(text("UPDATE scheduler_jobs SET paused = true WHERE id = 'paused'"))
    clock.advance(1)  # the leader tick reloads the rows
    await clock.wait_for_sleepers(2)
    clock.advance(20)
    await clock.wait_for_sleepers(2)
    assert not ran.is_set()
    assert await runs(engine, "paused") == []


async def test_job_session_is_closed_after_the_body(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    seen: list[JobContext] = []

    @scheduler.job(every(seconds=10), id="uses_session")
    async def uses_session(ctx: JobContext) -> None:
        await ctx.session.execute(text("SELECT 1"))
        seen.append(ctx)

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(10)
    await wait_for_runs(engine, "uses_session", 1)
    session = seen[0].session
    assert not session.in_transaction()
    assert session.sync_session.get_bind() is not None


async def test_jitter_delays_the_fire_but_keeps_the_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    slots: list[datetime] = []

    @scheduler.job(every(seconds=10), id="jittered", jitter=5)
    async def jittered(ctx: JobContext) -> None:
        slots.append(ctx.scheduled_at)

    slot = T0 + timedelta(seconds=10)
    delay = scheduler.jobs["jittered"].jitter_delay(slot)
    assert delay > 0
    await _leading(start_scheduler, scheduler, clock)
    clock.set(slot + timedelta(seconds=delay * 0.99))
    await clock.wait_for_sleepers(2)
    assert slots == []
    clock.set(slot + timedelta(seconds=delay))
    history = await wait_for_runs(engine, "jittered", 1)
    assert history == [("ok", slot)]
    assert slots == [slot]


def test_a_slot_has_the_same_jitter_delay_on_every_pass_and_every_leader() -> None:
    slot = T0 + timedelta(hours=1)
    leaders = [Scheduler(), Scheduler()]
    for scheduler in leaders:
        scheduler.job(every(hours=1), id="spread", jitter=300)(lambda ctx: None)
    first, failover = (scheduler.jobs["spread"] for scheduler in leaders)
    delay = first.jitter_delay(slot)
    assert 0 <= delay < 300
    assert [first.jitter_delay(slot) for _ in range(100)] == [delay] * 100
    assert failover.jitter_delay(slot) == delay
    assert first.jitter_delay(slot + timedelta(hours=1)) != delay


def test_jitter_delays_spread_evenly_over_the_jitter() -> None:
    spec = JobSpec(
        id="spread", name="Spread", func=lambda ctx: None, trigger=every(hours=1), jitter=300
    )
    delays = [spec.jitter_delay(T0 + timedelta(hours=n)) for n in range(2000)]
    assert all(0 <= delay < 300 for delay in delays)
    # A fixed set of slots: the bound is a fact about these 2000 values, never a flake.
    # (The mean of 2000 uniform draws is within 150 +- 10 with probability 1 - 1e-9.)
    assert 140 <= sum(delays) / len(delays) <= 160
    quarters = [sum(1 for delay in delays if q * 75 <= delay < (q + 1) * 75) for q in range(4)]
    assert all(400 <= count <= 600 for count in quarters)


async def test_jitter_is_drawn_once_per_slot_however_often_the_loop_wakes(
    start_scheduler: StartScheduler,
) -> None:
    """Every leader tick wakes the job loop; the delay of a slot must not be drawn again
    at each wake-up (that skews fires early), so the fires spread over the whole jitter."""
    clock = FakeClock(T0)
    scheduler = Scheduler()
    offsets: list[float] = []
    fired = asyncio.Event()

    @scheduler.job(every(minutes=5), id="spread", jitter=120)
    async def spread(ctx: JobContext) -> None:
        offsets.append((ctx.clock.now() - ctx.scheduled_at).total_seconds())
        fired.set()

    spec = scheduler.jobs["spread"]
    await start_scheduler(scheduler, clock=clock, lease_seconds=10, leader_tick_seconds=5)
    await clock.wait_for_sleepers(2)
    delays = [spec.jitter_delay(T0 + timedelta(minutes=5 * slot)) for slot in range(1, 17)]
    for slot in range(1, 17):
        clock.set(T0 + timedelta(minutes=5 * slot))
        fired.clear()
        # Step through the jitter window one leader tick at a time: 24 wake-ups.
        while not fired.is_set():
            await clock.wait_for_sleepers(2)
            clock.advance(5)
        await clock.wait_for_sleepers(2)
    assert len(offsets) == 16
    # Each slot fired after its own delay, never before it (how many wake-ups after it
    # depends on when the loop ran between the test's steps).
    assert all(delay <= offset for delay, offset in zip(delays, offsets, strict=True))
    assert sum(offsets) / len(offsets) >= 0.4 * 120


async def test_a_slot_weeks_late_is_claimed_and_the_job_moves_on(
    database: Database, engine: AsyncEngine
) -> None:
    """A history row never blocks a claim: lateness past int4 milliseconds (24.8 days)
    is recorded, and the job's next slot moves forward."""
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(minutes=15), id="late", misfire_grace=3600)(lambda ctx: None)
    spec = scheduler.jobs["late"]
    runner = make_runner(database, clock, 1)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    clock.advance(timedelta(days=26).total_seconds())
    claim = await claim_leader(runner, spec, rows["late"].next_run_at, None)
    assert claim is not None
    assert claim.next_slot > clock.now()
    assert (await runner.store.load(["late"]))["late"].next_run_at == claim.next_slot
    # The slots the outage passed over, then the run of the latest one.
    assert [status for status, _ in await runs(engine, "late")] == ["missed", "running"]


async def test_a_def_that_returns_a_coroutine_is_recorded_as_an_error_not_ok(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    """A body that never ran must not be recorded as a success."""
    clock = FakeClock(T0)
    scheduler = Scheduler()
    ran = threading.Event()

    async def body() -> None:
        ran.set()

    @scheduler.job(every(seconds=10), id="forgot_async")
    def forgot_async(ctx: JobContext) -> object:
        return body()

    await _leading(start_scheduler, scheduler, clock)
    clock.advance(10)
    history = await wait_for_runs(engine, "forgot_async", 1)
    assert [status for status, _ in history] == ["error"]
    async with engine.connect() as conn:
        error = (
            await conn.execute(
                text("SELECT last_error FROM scheduler_jobs WHERE id = 'forgot_async'")
            )
        ).scalar_one()
    assert "async def" in error
    assert not ran.is_set()
