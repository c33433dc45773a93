"""Run history and outbox rows are filtered by status (CLI, API, page); a status that
does not exist is refused naming the ones that do."""

from __future__ import annotations

import asyncio
import re

import pytest
from sqlalchemy import text

from app.db import Database
from app.operations.run_status import RUN_STATUSES

from .conftest import AUTH, Worker, app_command, execute, signed_in


@pytest.fixture
async def mixed_runs(database: Database) -> Database:
    """Job 'nightly' with five runs: ok, error, ok, error, timeout (ids 1-5)."""
    await execute(
        database,
        "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
        " VALUES ('nightly', 'Nightly sweep', 'every 900s', now())",
    )
    for index, status in enumerate(["ok", "error", "ok", "error", "timeout"], start=1):
        await execute(
            database,
            "INSERT INTO scheduler_runs (id, job_id, scope, slot, started_at, finished_at,"
            " status, lateness_ms, duration_ms, pid, host, error) OVERRIDING SYSTEM VALUE"
            " VALUES (:id, 'nightly', 'leader', now() - make_interval(mins => :ago),"
            " now(), now(), :status, 3, 20, 1, 'h', :error)",
            id=index,
            ago=10 - index,
            status=status,
            error=None if status == "ok" else f"RuntimeError: run {index}",
        )
    return database


async def test_the_run_statuses_offered_are_the_ones_the_database_allows(
    database: Database,
) -> None:
    async with database.engine.connect() as conn:
        check = (
            await conn.execute(
                text(
                    "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                    " WHERE conname = 'scheduler_runs_status'"
                )
            )
        ).scalar_one()
    assert set(re.findall(r"'([a-z_]+)'::text", check)) == set(RUN_STATUSES)


async def test_history_status_lists_only_the_runs_of_that_status(
    mixed_runs: Database, database_url: str
) -> None:
    result = await asyncio.to_thread(
        app_command, database_url, "jobs", "history", "nightly", "--status", "error", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert '"id": 4' in result.stdout and '"id": 2' in result.stdout
    assert '"status": "ok"' not in result.stdout and '"id": 5' not in result.stdout


async def test_history_with_a_status_that_does_not_exist_exits_2_naming_the_statuses(
    mixed_runs: Database, database_url: str
) -> None:
    result = await asyncio.to_thread(
        app_command, database_url, "jobs", "history", "nightly", "--status", "failed"
    )
    assert result.returncode == 2
    assert "'failed'" in result.stderr and "'error'" in result.stderr
    assert "'skipped_overlap'" in result.stderr


async def test_the_runs_api_filters_by_status_and_pages_within_it(
    mixed_runs: Database, worker: Worker
) -> None:
    async with worker() as client:
        first = await client.get("/admin/api/jobs/nightly/runs?status=error&limit=1", headers=AUTH)
        assert [run["id"] for run in first.json()["runs"]] == [4]
        rest = await client.get(
            f"/admin/api/jobs/nightly/runs?status=error&limit=1&before={first.json()['next_before']}",
            headers=AUTH,
        )
    assert [run["id"] for run in rest.json()["runs"]] == [2]


async def test_the_runs_api_refuses_a_status_that_does_not_exist_naming_the_statuses(
    mixed_runs: Database, worker: Worker
) -> None:
    async with worker() as client:
        response = await client.get("/admin/api/jobs/nightly/runs?status=failed", headers=AUTH)
    assert response.status_code == 422
    assert "'error'" in response.text and "'skipped_overlap'" in response.text


async def test_the_outbox_rows_api_refuses_a_status_that_does_not_exist_naming_the_statuses(
    worker: Worker,
) -> None:
    async with worker() as client:
        response = await client.get(
            "/admin/api/outboxes/grants/messages?status=failed", headers=AUTH
        )
    assert response.status_code == 422
    assert "'stuck'" in response.text and "'scheduled'" in response.text


async def test_the_job_page_links_a_filter_per_status_and_shows_only_those_runs(
    mixed_runs: Database, worker: Worker
) -> None:
    async with worker() as client:
        base, _ = await signed_in(client)
        page = (await client.get(f"{base}/jobs/nightly")).text
        assert f'href="{base}/jobs/nightly?status=error"' in page
        filtered = (await client.get(f"{base}/jobs/nightly?status=error")).text
    history = filtered[filtered.index('id="history"') :]
    assert re.findall(r'data-run="(\d+)"', history) == ["4", "2"]


async def test_the_job_page_refuses_a_status_that_does_not_exist(
    mixed_runs: Database, worker: Worker
) -> None:
    async with worker() as client:
        base, _ = await signed_in(client)
        response = await client.get(f"{base}/jobs/nightly?status=failed")
    assert response.status_code == 422
