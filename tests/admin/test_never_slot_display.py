"""A job whose next run an operator set to 'infinity' (never) reads as such everywhere
an operator looks: the admin API, the admin page, the health check and the CLI."""

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.main import create_app
from app.scheduler import JobContext, Role, Scheduler, every
from app.settings import Settings

from ..conftest import admin_session

TOKEN = "never-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def never(settings: Settings, database: Database) -> AsyncIterator[httpx.AsyncClient]:
    """The app with one hourly job, whose next run is then set to 'infinity'."""
    scheduler = Scheduler()

    @scheduler.job(every(hours=1), id="hourly", name="Hourly")
    async def hourly(ctx: JobContext) -> None:
        return None

    app = create_app(settings.model_copy(update={"ADMIN_TOKEN": SecretStr(TOKEN)}), scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.LEADER)
        await scheduler.supervisor.wait_until_firing()
        async with database.engine.begin() as conn:
            await conn.execute(
                text("UPDATE scheduler_jobs SET next_run_at = 'infinity' WHERE id = 'hourly'")
            )
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_the_jobs_api_answers_for_a_job_that_never_runs_again(
    never: httpx.AsyncClient,
) -> None:
    response = await never.get("/admin/api/jobs", headers=AUTH)
    assert response.status_code == 200, response.text
    [job] = [job for job in response.json() if job["id"] == "hourly"]
    # The last moment a timestamp holds, aware: parsed, compared and sorted as any other.
    assert datetime.fromisoformat(job["next_run_at"]) == datetime.max.replace(tzinfo=UTC)


async def test_the_admin_page_shows_never_for_a_job_that_never_runs_again(
    never: httpx.AsyncClient,
) -> None:
    base = await admin_session(never, TOKEN)
    page = await never.get(f"{base}/")
    assert page.status_code == 200, page.text
    assert "never" in page.text


async def test_a_job_that_never_runs_again_is_not_stale(never: httpx.AsyncClient) -> None:
    response = await never.get("/health/scheduler")
    assert response.status_code == 200, response.text


def test_the_cli_lists_a_job_that_never_runs_again(database_url: str) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
            " VALUES ('nightly', 'Nightly sweep', 'cron ''0 3 * * *'' UTC', 'infinity')"
        )
    listed = subprocess.run(
        [sys.executable, "-m", "app", "jobs"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    assert "never" in listed.stdout
