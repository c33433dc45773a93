"""A claimed body never starts once its running lease may have run out: the claim's
lease is measured on the database server's clock, and a body that began after it ran
out (the process froze, its clock jumped, between the claim and the start) could run
beside another leader's run of the job, which any process may start once the lease is
reaped. Such a slot is recorded 'missed' and its lease let go; its body never runs."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.runner import Runner
from app.scheduler.store import JobStore
from app.testing.claims import claim_leader

from .conftest import runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")
LEASE_SECONDS = 6.0


async def _lease_holder(engine: AsyncEngine, job_id: str) -> int | None:
    async with engine.connect() as conn:
        holder: int | None = (
            await conn.execute(
                text("SELECT running_run_id FROM scheduler_jobs WHERE id = :id"), {"id": job_id}
            )
        ).scalar_one()
        return holder


@pytest.mark.parametrize("kind", ["async", "thread"])
async def test_a_body_whose_running_lease_ran_out_before_it_began_never_runs(
    database: Database, engine: AsyncEngine, kind: str
) -> None:
    clock = FakeClock(T0)
    ran = threading.Event()
    scheduler = Scheduler()

    if kind == "async":

        async def body(ctx: JobContext) -> None:
            ran.set()

    else:

        def body(ctx: JobContext) -> None:  # type: ignore[misc]
            ran.set()

    scheduler.job(every(minutes=1), id="late", first_run=0)(body)
    spec = scheduler.jobs["late"]
    runner = Runner(
        JobStore(database.engine, pid=1, host="host-1", lease_clock=clock),
        clock=clock,
        zone=UTC_ZONE,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=LEASE_SECONDS,
    )
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    claim = await claim_leader(runner, spec, rows["late"].next_run_at, None)
    assert claim is not None and claim.runs
    # Between the claim and its body's start everything stands still past the lease.
    clock.advance(LEASE_SECONDS + 1)
    await asyncio.wait_for(runner.start(spec, claim), 10)
    await asyncio.wait_for(runner.wait_for_bodies(), 10)
    assert (ran.is_set(), [status for status, _ in await runs(engine, "late")]) == (
        False,
        ["missed"],
    ), "a body began after its running lease had run out"
    assert await _lease_holder(engine, "late") is None
