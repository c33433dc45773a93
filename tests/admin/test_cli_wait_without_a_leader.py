"""`python -m app jobs run ID --wait` when no process leads the schedule or waits to:
it answers at once, in one line, that nothing will run the request, exits 1, and
leaves the request queued for a leader that starts later. While a process holds the
leader key or waits behind its host's lock, it waits as for any run."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest
from sqlalchemy import text

from app.db import Database
from app.operations.runs import manual_run
from app.scheduler import Scheduler
from app.scheduler.host_standbys import HostStandby

from ..conftest import StartScheduler
from .conftest import app_command


async def _requested_at(database: Database, job_id: str) -> datetime | None:
    async with database.engine.connect() as conn:
        query = text("SELECT run_requested_at FROM scheduler_jobs WHERE id = :id")
        requested: datetime | None = (await conn.execute(query, {"id": job_id})).scalar_one()
    return requested


@pytest.mark.usefixtures("unled_report")
async def test_run_wait_without_a_leader_answers_at_once_in_one_line_and_exits_1(
    database_url: str,
) -> None:
    # The default --timeout (600 s): an answer within app_command's 60 s is at once.
    waited = app_command(database_url, "jobs", "run", "report", "--wait")
    assert waited.returncode == 1, waited.stderr
    [line] = waited.stdout.splitlines()
    assert "no process leads schedule default" in line
    assert "queued" in line


async def test_a_request_left_by_run_wait_without_a_leader_is_run_by_a_leader_that_starts(
    database_url: str,
    database: Database,
    unled_report: Scheduler,
    start_scheduler: StartScheduler,
) -> None:
    waited = app_command(database_url, "jobs", "run", "report", "--wait")
    assert waited.returncode == 1, waited.stderr
    requested = await _requested_at(database, "report")
    assert requested is not None
    await start_scheduler(unled_report)
    async with asyncio.timeout(30):
        while (run := await manual_run(database.engine, "report", requested)) is None or run[
            "status"
        ] == "running":
            await asyncio.sleep(0.05)
    assert run["status"] == "ok"


@pytest.mark.usefixtures("unled_report")
async def test_run_wait_waits_while_a_worker_waits_behind_its_host_lock(
    database_url: str, database: Database
) -> None:
    # Its sibling holds the host's lock file and is about to take the key: a leader
    # comes, so the request is not "for nobody".
    standby = HostStandby(
        database.engine, schedule="default", host="web-1", pid=4242, lease_seconds=120, timeout=5
    )
    await standby.note(None)
    waited = app_command(database_url, "jobs", "run", "report", "--wait", "--timeout", "2")
    assert waited.returncode == 1, waited.stderr
    assert "has not started after 2 s (--timeout)" in waited.stdout


@pytest.mark.usefixtures("unled_report")
async def test_run_without_wait_and_without_a_leader_says_nothing_runs_it_yet(
    database_url: str,
) -> None:
    queued = app_command(database_url, "jobs", "run", "report")
    assert queued.returncode == 0, queued.stderr
    assert "queued report" in queued.stdout
    assert "no process leads schedule default" in queued.stdout
