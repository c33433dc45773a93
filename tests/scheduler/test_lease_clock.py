"""The running lease is measured on the database server's clock, the one clock every
process shares: a process whose own clock runs ahead of the owner's by more than the
lease never takes a live run for a dead one (it used to reap it, and start the job
beside it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, SystemClock, every
from app.scheduler.registry import JobSpec
from app.scheduler.runner import Claim, Runner
from app.scheduler.store import JobStore
from app.testing.claims import claim_leader, claim_request

from ..conftest import SkewedClock
from .conftest import BlockingBodies, lease_ends_at, runs

LEASE_SECONDS = 6
UTC_ZONE = ZoneInfo("UTC")


def _ahead_clock() -> SkewedClock:
    """A host's own clock, set ahead of the other hosts' by more than the lease."""
    return SkewedClock(timedelta(seconds=LEASE_SECONDS + 5))


async def _noop(ctx: JobContext) -> None:
    return None


def _runner(database: Database, clock: SystemClock, pid: int) -> Runner:
    return Runner(
        JobStore(database.engine, pid=pid, host=f"host-{pid}"),
        clock=clock,
        zone=UTC_ZONE,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=LEASE_SECONDS,
    )


@dataclass
class LiveRun:
    """A leader run of job ``long`` whose thread body blocks, on a host with a true clock."""

    spec: JobSpec
    claim: Claim
    task: asyncio.Task[None]


@pytest.fixture
async def live_run(database: Database, bodies: BlockingBodies) -> AsyncIterator[LiveRun]:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="long", first_run=0)(bodies)
    spec = scheduler.jobs["long"]
    owner = _runner(database, SystemClock(), pid=1)
    rows = await owner.store.register_leader_jobs([spec], owner.clock.now(), UTC_ZONE)
    claim = await claim_leader(owner, spec, rows["long"].next_run_at, None)
    assert claim is not None and claim.runs
    task = owner.start(spec, claim)
    await bodies.entered()
    yield LiveRun(spec, claim, task)
    bodies.release.set()
    await task


async def test_a_reaper_whose_clock_runs_ahead_leaves_a_live_run_running(
    database: Database, engine: AsyncEngine, live_run: LiveRun
) -> None:
    reaper = JobStore(database.engine, pid=2, host="host-2")
    assert await reaper.reap(_ahead_clock().now()) == []
    assert [status for status, _ in await runs(engine, "long")] == ["running"]


async def test_a_leader_whose_clock_runs_ahead_starts_no_run_beside_a_live_one(
    database: Database, engine: AsyncEngine, live_run: LiveRun
) -> None:
    ahead = _runner(database, _ahead_clock(), pid=2)
    requested_at = ahead.clock.now()
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE scheduler_jobs SET run_requested_at = :at WHERE id = 'long'"),
            {"at": requested_at},
        )
    claim = await claim_request(ahead, live_run.spec, requested_at, None)
    assert claim is not None and not claim.runs
    assert [status for status, _ in await runs(engine, "long")] == ["running", "skipped_overlap"]


async def test_a_process_never_reaps_the_running_lease_of_a_body_it_runs_itself(
    database: Database, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC_ZONE))
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="long", first_run=0)(bodies)
    spec = scheduler.jobs["long"]
    owner = Runner(
        JobStore(database.engine, pid=1, host="host-1", lease_clock=clock),
        clock=clock,
        zone=UTC_ZONE,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=LEASE_SECONDS,
    )
    rows = await owner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    claim = await claim_leader(owner, spec, rows["long"].next_run_at, None)
    assert claim is not None and claim.runs
    task = owner.start(spec, claim)
    await bodies.entered()
    # The process froze past the lease, and its leader tick came round before its
    # renewal did: in the database the lease has run out while the body runs here.
    await lease_ends_at(engine, "long", clock.now() - timedelta(seconds=1))
    try:
        assert await owner.store.reap(clock.now(), owner.renewing) == []
        assert [status for status, _ in await runs(engine, "long")] == ["running"]
    finally:
        bodies.release.set()
        await task
    assert [status for status, _ in await runs(engine, "long")] == ["ok"]


async def test_a_reaper_on_a_host_two_minutes_off_leaves_a_live_run_running(
    database: Database, engine: AsyncEngine, live_run: LiveRun, skewed_clock: SkewedClock
) -> None:
    reaper = JobStore(database.engine, pid=2, host="host-2")
    assert await reaper.reap(skewed_clock.now()) == []
    assert [status for status, _ in await runs(engine, "long")] == ["running"]


async def test_a_reaper_on_a_host_two_minutes_off_reaps_a_run_whose_lease_ran_out(
    database: Database, engine: AsyncEngine, skewed_clock: SkewedClock
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="long", first_run=0)(_noop)
    spec = scheduler.jobs["long"]
    owner = _runner(database, SystemClock(), pid=1)
    rows = await owner.store.register_leader_jobs([spec], owner.clock.now(), UTC_ZONE)
    claim = await claim_leader(owner, spec, rows["long"].next_run_at, None)
    assert claim is not None and claim.runs
    # Its owner died before starting the body: the lease ran out a moment ago.
    await lease_ends_at(engine, "long", "clock_timestamp() - interval '1 second'")
    reaper = JobStore(database.engine, pid=2, host="host-2")
    assert await reaper.reap(skewed_clock.now()) == ["long"]
    assert [status for status, _ in await runs(engine, "long")] == ["abandoned"]


async def test_a_leader_on_a_host_two_minutes_off_starts_no_run_beside_a_live_one(
    database: Database, engine: AsyncEngine, live_run: LiveRun, skewed_clock: SkewedClock
) -> None:
    skewed = _runner(database, skewed_clock, pid=2)
    requested_at = skewed.clock.now()
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE scheduler_jobs SET run_requested_at = :at WHERE id = 'long'"),
            {"at": requested_at},
        )
    claim = await claim_request(skewed, live_run.spec, requested_at, None)
    assert claim is not None and not claim.runs
    assert [status for status, _ in await runs(engine, "long")] == ["running", "skipped_overlap"]
