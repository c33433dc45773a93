"""A job never overlaps itself: not after a lost lock, not across processes.

A thread cannot be cancelled, so a body may outlive its worker's leadership. The
process remembers it (the Runner) and the job row says so (the running lease), so no
leader starts the next slot while it runs, and its real outcome is recorded when it ends.
"""

import logging
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Role, Scheduler, every
from app.scheduler.runner import Runner
from app.scheduler.store import JobStore
from app.scheduler.supervisor import Supervisor
from app.testing.claims import claim_leader

from .conftest import (
    BlockingBodies,
    StartScheduler,
    eventually,
    wait_for_runs,
    wait_for_runs_past_busy_rows,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# Long enough that no clock step in these tests outruns the running lease by itself.
LEASE = 30


def _blocking_job(bodies: BlockingBodies) -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(seconds=10), id="long_thread")(bodies)
    return scheduler


async def _terminate_lock_connection(engine: AsyncEngine, supervisor: Supervisor) -> int:
    assert supervisor.lock is not None
    backend_pid = supervisor.lock.backend_pid
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend_pid})
    return backend_pid


async def _first_body_running(
    start_scheduler: StartScheduler, scheduler: Scheduler, clock: FakeClock, bodies: BlockingBodies
) -> Supervisor:
    supervisor = await start_scheduler(scheduler, clock=clock, lease_seconds=LEASE)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await bodies.entered()
    # Parked again (tick, job loop, lease renewal): no statement is in flight on the
    # lock connection when a test terminates it.
    await clock.wait_for_sleepers(3)
    return supervisor


async def test_a_thread_job_never_overlaps_itself_after_a_lost_lock_and_re_promotion(
    start_scheduler: StartScheduler, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    supervisor = await _first_body_running(start_scheduler, _blocking_job(bodies), clock, bodies)
    old = await _terminate_lock_connection(engine, supervisor)

    async def re_promoted() -> bool:
        return supervisor.lock is not None and supervisor.lock.backend_pid != old

    await eventually(re_promoted, what="a re-promotion on a new lock connection")
    await supervisor.wait_until_firing()
    # Parked: the leader's tick and job loop, and the running body's lease renewal.
    await clock.wait_for_sleepers(3)
    clock.advance(10)
    history = await wait_for_runs_past_busy_rows(engine, clock, "long_thread", 2, sleepers=3)
    assert [status for status, _ in history] == ["running", "skipped_overlap"]
    assert bodies.most_at_once == 1
    bodies.release.set()
    await wait_for_runs(engine, "long_thread", 2)


async def test_a_new_leader_records_skipped_overlap_while_the_old_leaders_thread_runs(
    start_scheduler: StartScheduler, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    first = await _first_body_running(start_scheduler, _blocking_job(bodies), clock, bodies)
    second = await start_scheduler(_blocking_job(bodies), clock=clock, lease_seconds=LEASE)
    await second.wait_for_role(Role.STANDBY)
    await _terminate_lock_connection(engine, first)
    await second.wait_until_firing()
    # Parked: the new leader's tick and job loop, and the old body's lease renewal.
    await clock.wait_for_sleepers(3)
    clock.advance(10)
    history = await wait_for_runs_past_busy_rows(engine, clock, "long_thread", 2, sleepers=3)
    assert [status for status, _ in history] == ["running", "skipped_overlap"]
    assert bodies.most_at_once == 1
    bodies.release.set()
    await wait_for_runs(engine, "long_thread", 2)


async def test_a_thread_that_outlives_its_leadership_is_recorded_with_its_real_outcome(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    bodies: BlockingBodies,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock(T0)
    supervisor = await _first_body_running(start_scheduler, _blocking_job(bodies), clock, bodies)
    await _terminate_lock_connection(engine, supervisor)

    async def demoted() -> bool:
        return _logged(caplog, "scheduler.demoted")

    await eventually(demoted, what="the demotion of the first leader")
    bodies.release.set()
    history = await wait_for_runs(engine, "long_thread", 1)
    assert history == [("ok", T0 + timedelta(seconds=10))]
    assert _logged(caplog, "job.finished_after_demotion")


async def test_a_crashed_owners_running_lease_runs_out_and_the_job_fires_again(
    start_scheduler: StartScheduler, database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    fired: list[datetime] = []

    @scheduler.job(every(seconds=10), id="orphaned")
    async def orphaned(ctx: JobContext) -> None:
        fired.append(ctx.scheduled_at)

    spec = scheduler.jobs["orphaned"]
    # A process that claimed slot T0+10 with a 15 s running lease, then died: it never
    # renews the lease nor records an outcome.
    dead = Runner(
        JobStore(database.engine, pid=999_999, host="gone", lease_clock=clock),
        clock=clock,
        zone=ZoneInfo("UTC"),
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=15,
    )
    rows = await dead.store.register_leader_jobs([spec], clock.now(), ZoneInfo("UTC"))
    clock.advance(10)
    assert await claim_leader(dead, spec, rows["orphaned"].next_run_at, None) is not None
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)  # T0+20: the dead owner's lease (until T0+25) still holds
    await wait_for_runs(engine, "orphaned", 2, finished=False)
    await clock.wait_for_sleepers(2)
    clock.advance(10)  # T0+30: it ran out, and its run is reaped
    history = await wait_for_runs(engine, "orphaned", 3)
    assert history == [
        ("abandoned", T0 + timedelta(seconds=10)),
        ("skipped_overlap", T0 + timedelta(seconds=20)),
        ("ok", T0 + timedelta(seconds=30)),
    ]
    assert fired == [T0 + timedelta(seconds=30)]


def _logged(caplog: pytest.LogCaptureFixture, action: str) -> bool:
    return any(getattr(record, "action", None) == action for record in caplog.records)


async def test_a_per_replica_thread_job_runs_on_every_worker_and_takes_no_running_lease(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    workers: list[Scheduler] = []
    for _ in range(2):
        scheduler = Scheduler()
        scheduler.job(every(seconds=10), id="sweep", leader_only=False)(lambda ctx: None)
        workers.append(scheduler)
    for scheduler in workers:
        await start_scheduler(scheduler, clock=clock)
    # Both replica loops, one leader tick.
    await clock.wait_for_sleepers(3)
    clock.advance(10)
    history = await wait_for_runs(engine, "sweep", 2)
    assert history == [("ok", T0 + timedelta(seconds=10))] * 2
    async with engine.connect() as conn:
        lease = await conn.execute(
            text("SELECT running_run_id, running_until FROM scheduler_jobs WHERE id = 'sweep'")
        )
    assert lease.one() == (None, None)
