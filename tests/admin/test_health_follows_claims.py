"""Health follows the claims, not a heartbeat: a due slot or run-now request that no
claim took for longer than a leader tick plus the handover grace (and the slot's own
jitter) makes /health/scheduler answer 503 naming the job, read from the job rows on
the database's clock; what an operator reads (job list, page, CLI) says the job is due
and not claimed, and which backend holds its row."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.health import unclaimed_jobs
from app.operations.jobs import list_jobs
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.store import JobStore

from ..conftest import SkewedClock, StartScheduler, admin_session
from ..scheduler.conftest import row_held, wait_for_runs_past_busy_rows
from .conftest import ADMIN_TOKEN, WorkerAdmin

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")
_BEARER = f"Bearer {ADMIN_TOKEN}"
SLOT = T0 + timedelta(minutes=1)
# The test settings' LEADER_TICK_SECONDS plus HANDOVER_GRACE_SECONDS.
TICK_AND_GRACE = timedelta(seconds=1)


async def _noop(ctx: JobContext) -> None:
    return None


def _minutely(*job_ids: str) -> Scheduler:
    scheduler = Scheduler()
    for job_id in job_ids:
        scheduler.job(every(minutes=1), id=job_id)(_noop)
    return scheduler


async def _health_until(
    client: httpx.AsyncClient, condition: Callable[[dict[str, Any]], bool]
) -> httpx.Response:
    """/health/scheduler once its body meets ``condition`` (10 s at most)."""
    deadline = asyncio.get_running_loop().time() + 10
    while not condition((response := await client.get("/health/scheduler")).json()):
        assert asyncio.get_running_loop().time() < deadline, (
            f"health never met the condition; it answered {response.status_code} {response.json()}"
        )
        await asyncio.sleep(0.05)
    return response


async def test_health_answers_503_naming_the_jobs_whose_due_slots_go_unclaimed(
    start_scheduler: StartScheduler, engine: AsyncEngine, worker_admin: WorkerAdmin
) -> None:
    clock = FakeClock(T0)
    scheduler = _minutely("held", "free")
    async with worker_admin(scheduler, clock) as client:
        supervisor = await start_scheduler(scheduler, clock=clock)
        await supervisor.wait_until_firing()
        async with row_held(engine, "held") as holder:
            await clock.wait_for_sleepers(2)
            clock.set(SLOT + TICK_AND_GRACE + timedelta(seconds=0.5))
            response = await _health_until(
                client, lambda body: body.get("unclaimed_jobs") == ["held"] and body["firing"]
            )
            assert response.status_code == 503
            assert response.json()["status"] == "unhealthy"
            assert response.json()["broken_jobs"] == []
            await holder.rollback()
        # Claimed within a tick once its row is free: healthy again.
        await clock.wait_for_sleepers(2)
        clock.advance(TICK_AND_GRACE)
        response = await _health_until(client, lambda body: body["status"] == "ok")
        assert response.status_code == 200 and response.json()["unclaimed_jobs"] == []


async def test_health_stays_ok_while_a_body_runs_past_its_next_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine, worker_admin: WorkerAdmin
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    entered, release = asyncio.Event(), asyncio.Event()

    @scheduler.job(every(minutes=1), id="long")
    async def long(ctx: JobContext) -> None:
        entered.set()
        await release.wait()

    async with worker_admin(scheduler, clock) as client:
        supervisor = await start_scheduler(scheduler, clock=clock)
        await supervisor.wait_until_firing()
        try:
            await clock.wait_for_sleepers(2)
            clock.set(SLOT)
            await asyncio.wait_for(entered.wait(), 10)
            # Its next slot comes while the body runs: claimed, as skipped_overlap. The
            # claim may meet the row held for a moment by the body's lease renewal (woken
            # by the same step) and is then retried on the fake clock, which only the
            # test moves. Parked: the leader's tick and job loop, and the renewal.
            await clock.wait_for_sleepers(3)
            clock.set(SLOT + timedelta(minutes=1))
            history = await wait_for_runs_past_busy_rows(engine, clock, "long", 2, sleepers=3)
            assert [status for status, _ in history] == [
                "running",
                "skipped_overlap",
            ]
            clock.advance(TICK_AND_GRACE * 2)
            response = await _health_until(client, lambda body: body["firing"])
        finally:
            release.set()
    assert response.json()["unclaimed_jobs"] == [], response.json()
    assert response.status_code == 200, response.json()


@pytest.mark.parametrize("skew", [timedelta(minutes=2), timedelta(minutes=-2)], ids=str)
async def test_health_reads_unclaimed_slots_on_the_databases_clock_from_a_skewed_host(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    worker_admin: WorkerAdmin,
    skew: timedelta,
) -> None:
    """The leader and the database share the real clock; the host that serves health
    runs ``skew`` off them. "upcoming" is due in a minute, "held" was due 30 s ago
    (its row held, so it stays unclaimed), both on the database's clock."""
    scheduler = _minutely("upcoming", "held")
    rows = JobStore(engine, pid=0, host="previous-release")
    await rows.register_leader_jobs(scheduler.jobs.values(), T0, UTC_ZONE)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE scheduler_jobs SET next_run_at = CASE id"
                " WHEN 'upcoming' THEN now() + interval '1 minute'"
                " ELSE now() - interval '30 seconds' END"
            )
        )
    async with (
        worker_admin(scheduler, SkewedClock(skew)) as client,
        row_held(engine, "held") as holder,
    ):
        supervisor = await start_scheduler(scheduler)
        await supervisor.wait_until_firing()
        response = await _health_until(client, lambda body: body["firing"])
        listed = await client.get("/admin/api/jobs", headers={"Authorization": _BEARER})
        jobs = {job["id"]: job for job in listed.json()}
        await holder.rollback()
    assert response.json()["unclaimed_jobs"] == ["held"], response.json()
    assert jobs["upcoming"]["unclaimed_since"] is None
    assert 30 <= jobs["held"]["unclaimed_seconds"] < 60


def _row(
    job_id: str, waited: float, *, request: bool = False, broken: bool = False
) -> dict[str, Any]:
    """A job list row whose slot (or run-now request) has waited ``waited`` seconds
    unclaimed, on the database's clock."""
    since = SLOT
    return {
        "id": job_id,
        "paused": False,
        "broken": broken,
        "next_run_at": SLOT + timedelta(hours=1) if request else SLOT,
        "unclaimed_since": since,
        "unclaimed_seconds": waited,
    }


def _jittered() -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="plain")(_noop)
    scheduler.job(every(minutes=1), id="jittered", jitter=30)(_noop)
    scheduler.job(every(minutes=1), id="per-worker", leader_only=False)(_noop)
    return scheduler


JITTER = _jittered().jobs["jittered"].jitter_delay(SLOT)


@pytest.mark.parametrize(
    ("row", "named"),
    [
        (_row("plain", 1.0), False),  # a tick and the grace: not longer
        (_row("plain", 1.001), True),
        (_row("jittered", JITTER + 1.0), False),  # the slot fires its jitter after it
        (_row("jittered", JITTER + 1.001), True),
        (_row("jittered", 1.001, request=True), True),  # a request fires at once
        (_row("plain", 3600, broken=True), False),  # reported as broken
        (_row("per-worker", 3600), False),  # each worker runs its own slots
        (_row("elsewhere", 3600), False),  # not a job of this app
    ],
)
def test_health_allows_a_due_slot_a_tick_and_the_handover_grace_after_it_fires(
    row: dict[str, Any], named: bool
) -> None:
    assert unclaimed_jobs(_jittered(), [row], TICK_AND_GRACE) == ([row["id"]] if named else [])


async def _insert_jobs(engine: AsyncEngine, at: datetime) -> None:
    """Jobs of every kind whose moment is ``at`` on the lease clock or around it."""
    rows = {
        "due": ("false", "true", "CAST(:at AS timestamptz) - interval '10 seconds'", "NULL"),
        "asked": (
            "false",
            "true",
            "CAST(:at AS timestamptz) + interval '1 hour'",
            "CAST(:at AS timestamptz) - interval '4 seconds'",
        ),
        "paused": ("true", "true", "CAST(:at AS timestamptz) - interval '1 hour'", "NULL"),
        "per-worker": ("false", "false", "CAST(:at AS timestamptz) - interval '1 hour'", "NULL"),
        "never": ("false", "true", "'infinity'", "NULL"),
        "upcoming": ("false", "true", "CAST(:at AS timestamptz) + interval '1 second'", "NULL"),
    }
    async with engine.begin() as conn:
        for job_id, (paused, leader_only, next_run_at, requested) in rows.items():
            await conn.execute(
                text(
                    "INSERT INTO scheduler_jobs (id, name, trigger, leader_only, paused,"
                    f" next_run_at, run_requested_at) VALUES (:id, :id, 'every 60s',"
                    f" {leader_only}, {paused}, {next_run_at}, {requested})"
                ),
                {"id": job_id, "at": at},
            )


async def test_the_job_list_shows_each_due_slot_not_claimed_on_the_lease_clock(
    engine: AsyncEngine,
) -> None:
    await _insert_jobs(engine, SLOT)
    jobs = {job["id"]: job for job in await list_jobs(engine, SLOT)}
    unclaimed = {
        job_id: (job["unclaimed_since"], job["unclaimed_seconds"])
        for job_id, job in jobs.items()
        if job["unclaimed_since"] is not None
    }
    assert unclaimed == {
        "due": (SLOT - timedelta(seconds=10), 10.0),
        "asked": (SLOT - timedelta(seconds=4), 4.0),
    }


async def test_the_job_list_names_the_backend_whose_transaction_holds_a_due_jobs_row(
    engine: AsyncEngine,
) -> None:
    await _insert_jobs(engine, SLOT)
    async with row_held(engine, "due") as holder:
        holder_pid = (await holder.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        jobs = {job["id"]: job for job in await list_jobs(engine, SLOT)}
        await holder.rollback()
    assert jobs["due"]["held_by"] == holder_pid
    assert jobs["asked"]["held_by"] is None


async def test_the_page_says_a_job_is_due_and_not_claimed_and_who_holds_its_row(
    start_scheduler: StartScheduler, engine: AsyncEngine, worker_admin: WorkerAdmin
) -> None:
    clock = FakeClock(T0)
    scheduler = _minutely("held")
    async with worker_admin(scheduler, clock) as client:
        supervisor = await start_scheduler(scheduler, clock=clock)
        await supervisor.wait_until_firing()
        async with row_held(engine, "held") as holder:
            holder_pid = (await holder.execute(text("SELECT pg_backend_pid()"))).scalar_one()
            await clock.wait_for_sleepers(2)
            clock.set(SLOT + timedelta(minutes=3))
            base = await admin_session(client, ADMIN_TOKEN)
            page = (await client.get(f"{base}/")).text
            await holder.rollback()
    row = page[page.index('data-job="held"') :].split("</tr>")[0]
    assert "due, not claimed for 3 min" in row, row
    assert f"its row is held by backend {holder_pid}" in row, row


def test_the_cli_says_a_job_is_due_and_not_claimed_and_who_holds_its_row(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as setup:
        setup.execute(
            "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
            " VALUES ('nightly', 'Nightly', 'every 60s', now() - interval '2 hours')"
        )
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM scheduler_jobs WHERE id = 'nightly' FOR UPDATE")
        holder_pid = holder.info.backend_pid
        result = subprocess.run(
            [sys.executable, "-m", "app", "jobs"],
            env={**os.environ, "DATABASE_URL": database_url},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        holder.rollback()
    assert result.returncode == 0, result.stderr
    assert "due, not claimed for 2 h" in result.stdout, result.stdout
    assert f"its row is held by backend {holder_pid}" in result.stdout, result.stdout
