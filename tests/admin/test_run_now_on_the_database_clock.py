"""A run-now request is due from the moment it is asked, on the database server's
clock: asked through the admin API of a worker whose clock runs two minutes ahead of
the database's, or two behind, the job list says it has waited no longer than it has,
and /health/scheduler names it once it has gone unclaimed for a leader tick and the
handover grace, not two minutes early or late."""

from __future__ import annotations

import argparse
import asyncio
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.cli.commands import add_commands, run_command
from app.scheduler import JobContext, Scheduler, SystemClock, every
from app.scheduler.store import JobStore
from app.settings import Settings

from ..conftest import SkewedClock
from .conftest import ADMIN_TOKEN, WorkerAdmin

_BEARER = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# The test settings' LEADER_TICK_SECONDS plus HANDOVER_GRACE_SECONDS.
_TICK_AND_GRACE = 1.0


async def _noop(ctx: JobContext) -> None:
    return None


async def _hourly(engine: AsyncEngine) -> Scheduler:
    """Job "hourly", its row registered (its next slot an hour from now); no leader runs,
    so a run-now request stays unclaimed."""
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(_noop)
    rows = JobStore(engine, pid=0, host="previous-release")
    await rows.register_leader_jobs(scheduler.jobs.values(), SystemClock().now(), ZoneInfo("UTC"))
    return scheduler


async def _listed(client: httpx.AsyncClient) -> dict[str, object]:
    [job] = (await client.get("/admin/api/jobs", headers=_BEARER)).json()
    return dict(job)


async def _ask(
    surface: str, client: httpx.AsyncClient, settings: Settings, clock: SkewedClock
) -> None:
    """Ask for a run of "hourly" now through the admin API (``client``'s app) or the CLI
    on a machine whose clock is ``clock``."""
    if surface == "api":
        asked = await client.post("/admin/api/jobs/hourly/run", headers=_BEARER)
        assert asked.status_code == 202, asked.text
        return
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    await run_command(settings, parser.parse_args(["jobs", "run", "hourly"]), clock=clock)


@pytest.mark.parametrize("surface", ["api", "cli"])
async def test_a_run_now_asked_on_a_host_two_minutes_off_has_waited_only_since_it_was_asked(
    engine: AsyncEngine,
    worker_admin: WorkerAdmin,
    settings: Settings,
    skewed_clock: SkewedClock,
    surface: str,
) -> None:
    scheduler = await _hourly(engine)
    async with worker_admin(scheduler, skewed_clock) as client:
        await _ask(surface, client, settings, skewed_clock)
        job = await _listed(client)
    waited = job["unclaimed_seconds"]
    assert isinstance(waited, float) and 0 <= waited < 5, job


async def test_health_names_a_run_now_asked_on_a_host_two_minutes_off_after_a_tick_and_grace(
    engine: AsyncEngine, worker_admin: WorkerAdmin, skewed_clock: SkewedClock
) -> None:
    scheduler = await _hourly(engine)
    async with worker_admin(scheduler, skewed_clock) as client:
        first = (await client.get("/health/scheduler")).json()
        asked = await client.post("/admin/api/jobs/hourly/run", headers=_BEARER)
        assert asked.status_code == 202, asked.text
        at_once = (await client.get("/health/scheduler")).json()
        # Unclaimed for longer than a tick and the grace, on the database's clock.
        deadline = asyncio.get_running_loop().time() + 10
        while (later := (await client.get("/health/scheduler")).json())["unclaimed_jobs"] != [
            "hourly"
        ] and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
    assert first["unclaimed_jobs"] == [], first
    assert (at_once["unclaimed_jobs"], later["unclaimed_jobs"]) == ([], ["hourly"]), (
        at_once,
        later,
    )
