"""`python -m app jobs run ID --wait`: the run's outcome, in the exit code too.

The command asks for a run now, waits until the leader has run it, prints the run as
`jobs history` does, and exits 0 only when it ended ok; a run that the leader does not
take within --timeout is a failure naming the wait (with no leader at all, see
test_cli_wait_without_a_leader.py)."""

from __future__ import annotations

import asyncio
import os
import sys
from zoneinfo import ZoneInfo

import pytest

from app.db import Database
from app.scheduler import JobContext, Scheduler, SystemClock, every
from app.scheduler.store import JobStore

from ..conftest import StartScheduler


async def _report(ctx: JobContext) -> None:
    return None


async def _broken_report(ctx: JobContext) -> None:
    raise RuntimeError("the report store answered 503")


def _jobs() -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="report")(_report)
    scheduler.job(every(hours=1), id="broken_report")(_broken_report)
    return scheduler


async def _cli(database_url: str, *args: str) -> tuple[int, str, str]:
    command = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        env={**os.environ, "DATABASE_URL": database_url},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(command.communicate(), 60)
    assert command.returncode is not None
    return command.returncode, out.decode(), err.decode()


@pytest.fixture
async def leading(start_scheduler: StartScheduler) -> None:
    supervisor = await start_scheduler(_jobs())
    await supervisor.wait_until_firing()


@pytest.mark.usefixtures("leading")
async def test_run_wait_prints_the_run_and_exits_0_when_it_ends_ok(database_url: str) -> None:
    code, out, err = await _cli(database_url, "jobs", "run", "report", "--wait")
    assert code == 0, err
    [_, run] = out.splitlines()
    assert " ok " in run and " yes " in run


@pytest.mark.usefixtures("leading")
async def test_run_wait_exits_1_printing_the_error_when_the_run_fails(database_url: str) -> None:
    code, out, _ = await _cli(database_url, "jobs", "run", "broken_report", "--wait")
    assert code == 1
    assert " error " in out.splitlines()[1]
    assert "RuntimeError: the report store answered 503" in out


@pytest.mark.usefixtures("leader_key_backend")
async def test_run_wait_exits_1_after_the_timeout_naming_it_when_the_leader_takes_no_request(
    database_url: str, database: Database
) -> None:
    # The key's holder fires nothing (a frozen leader): a leader holds the schedule, so
    # the command waits for it.
    rows = JobStore(database.engine, pid=0, host="previous-release")
    await rows.register_leader_jobs(_jobs().jobs.values(), SystemClock().now(), ZoneInfo("UTC"))
    code, out, _ = await _cli(database_url, "jobs", "run", "report", "--wait", "--timeout", "1")
    assert code == 1
    assert "has not started after 1 s (--timeout)" in out
