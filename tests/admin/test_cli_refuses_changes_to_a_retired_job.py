"""A retired job (no release its schedule's leader runs registers it) is not paused,
resumed or run now, from the CLI or the admin API alike: the refusal is one
(app/operations/jobs.py), answers 409 (the CLI exits 1) and names `jobs forget ID`,
the way to remove the job."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from app.db import Database

from .conftest import AUTH, Worker, app_command


async def _row(database: Database, job_id: str) -> tuple[bool, object]:
    async with database.engine.connect() as conn:
        query = text("SELECT paused, run_requested_at FROM scheduler_jobs WHERE id = :id")
        row = (await conn.execute(query, {"id": job_id})).one()
    return row.paused, row.run_requested_at


@pytest.mark.usefixtures("retired_old_report")
@pytest.mark.parametrize("command", ["pause", "resume", "run"])
async def test_the_cli_refuses_to_change_a_retired_job_naming_jobs_forget(
    database_url: str, database: Database, command: str
) -> None:
    refused = app_command(database_url, "jobs", command, "old_report")
    assert refused.returncode == 1, refused.stdout
    [line] = refused.stderr.splitlines()
    assert "old_report" in line and "retired" in line
    assert "jobs forget old_report" in line
    assert await _row(database, "old_report") == (False, None)


@pytest.mark.usefixtures("retired_old_report")
@pytest.mark.parametrize("action", ["pause", "resume", "run"])
async def test_the_admin_api_refuses_to_change_a_retired_job_naming_jobs_forget(
    worker: Worker, database: Database, action: str
) -> None:
    async with worker() as client:
        refused = await client.post(f"/admin/api/jobs/old_report/{action}", headers=AUTH)
    assert refused.status_code == 409
    assert "jobs forget old_report" in refused.json()["detail"]
    assert await _row(database, "old_report") == (False, None)
