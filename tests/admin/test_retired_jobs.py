"""A retired job (its schedule's leader no longer registers it) on the operator's
surfaces: hidden from the default listing, shown when asked, never run now, and
forgotten (its row and history deleted) only when retired."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import text

from app.db import Database
from app.scheduler import SystemClock
from app.scheduler.store import JobStore

from ..conftest import release
from .conftest import AUTH, Serve


@asynccontextmanager
async def _leading(serve: Serve, *job_ids: str) -> AsyncIterator[httpx.AsyncClient]:
    """The admin of a release registering ``job_ids``, once its leader fires (its
    promotion has settled which jobs are retired)."""
    scheduler = release(*job_ids)
    async with serve(scheduler) as client:
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        yield client


@pytest.fixture
async def retired_report(database: Database) -> None:
    """An older release registered 'report' and 'old_report'; 'old_report' ran once."""
    rows = JobStore(database.engine, pid=0, host="previous-release")
    specs = release("report", "old_report").jobs.values()
    await rows.register_leader_jobs(specs, SystemClock().now(), ZoneInfo("UTC"))
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_runs (job_id, scope, slot, started_at, finished_at,"
                " status, lateness_ms, pid, host) VALUES ('old_report', 'leader', now(), now(),"
                " now(), 'ok', 0, 1, 'previous-release')"
            )
        )


async def _ids(client: httpx.AsyncClient, query: str = "") -> list[str]:
    return [job["id"] for job in (await client.get(f"/admin/api/jobs{query}", headers=AUTH)).json()]


@pytest.mark.usefixtures("retired_report")
async def test_a_retired_job_is_listed_only_when_asked_for(serve: Serve) -> None:
    async with _leading(serve, "report") as client:
        assert await _ids(client) == ["report"]
        assert await _ids(client, "?retired=true") == ["old_report", "report"]


@pytest.mark.usefixtures("retired_report")
async def test_a_retired_job_cannot_be_run_now(serve: Serve) -> None:
    async with _leading(serve, "report") as client:
        asked = await client.post("/admin/api/jobs/old_report/run", headers=AUTH)
    assert asked.status_code == 409
    assert "retired" in asked.json()["detail"]


@pytest.mark.usefixtures("retired_report")
async def test_forgetting_a_retired_job_deletes_its_row_and_history(
    serve: Serve, database: Database
) -> None:
    async with _leading(serve, "report") as client:
        forgotten = await client.delete("/admin/api/jobs/old_report", headers=AUTH)
        assert forgotten.json() == {"status": "forgotten", "runs_deleted": 1}
        assert (
            await client.get("/admin/api/jobs/old_report/runs", headers=AUTH)
        ).status_code == 404
    async with database.engine.connect() as conn:
        left = await conn.execute(
            text("SELECT count(*) FROM scheduler_runs WHERE job_id = 'old_report'")
        )
        assert left.scalar_one() == 0


@pytest.mark.usefixtures("retired_report")
async def test_forgetting_a_live_job_is_refused(serve: Serve) -> None:
    async with _leading(serve, "report") as client:
        refused = await client.delete("/admin/api/jobs/report", headers=AUTH)
        assert refused.status_code == 409
        assert await _ids(client) == ["report"]
