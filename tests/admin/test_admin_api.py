"""The admin API: auth, jobs, runs, run now, pause, leader, outboxes; bad input is a 4xx."""

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.main import create_app
from app.scheduler import FakeClock, JobContext, Role, Scheduler, every
from app.settings import Settings

TOKEN = "s3cret-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def fired() -> asyncio.Event:
    return asyncio.Event()


@pytest.fixture
async def admin(
    settings: Settings, fired: asyncio.Event
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI]]:
    scheduler = Scheduler()

    @scheduler.job(every(hours=1), id="hourly_report", name="Hourly report")
    async def hourly_report(ctx: JobContext) -> None:
        fired.set()

    app = create_app(settings.model_copy(update={"ADMIN_TOKEN": SecretStr(TOKEN)}), scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.LEADER)
        await scheduler.supervisor.wait_until_firing()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client, app


async def test_admin_routes_404_without_a_configured_token(settings: Settings) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/admin/api/jobs", headers=AUTH)).status_code == 404


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}]
)
async def test_missing_or_wrong_token_gets_401(
    admin: tuple[httpx.AsyncClient, FastAPI], headers: dict[str, str]
) -> None:
    client, _ = admin
    response = await client.get("/admin/api/jobs", headers=headers)
    assert response.status_code == 401
    assert TOKEN not in response.text


async def test_jobs_lists_schedule_and_state(admin: tuple[httpx.AsyncClient, FastAPI]) -> None:
    client, _ = admin
    jobs = (await client.get("/admin/api/jobs", headers=AUTH)).json()
    job = next(job for job in jobs if job["id"] == "hourly_report")
    assert job["name"] == "Hourly report"
    assert job["trigger"] == "every 3600s"
    assert job["running"] is False and job["paused"] is False
    assert job["next_run_at"] is not None


async def test_runs_are_paginated_newest_first(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database
) -> None:
    client, _ = admin
    async with database.engine.begin() as conn:
        for minute in range(3):
            await conn.execute(
                text(
                    "INSERT INTO scheduler_runs (job_id, scope, slot, started_at, status,"
                    " lateness_ms, pid, host) VALUES ('hourly_report', 'leader',"
                    " now() - make_interval(mins => :m), now(), 'ok', 0, 1, 'h')"
                ),
                {"m": minute},
            )
    first = (await client.get("/admin/api/jobs/hourly_report/runs?limit=2", headers=AUTH)).json()
    assert len(first["runs"]) == 2
    rest = await client.get(
        f"/admin/api/jobs/hourly_report/runs?limit=2&before={first['next_before']}", headers=AUTH
    )
    assert len(rest.json()["runs"]) == 1
    assert rest.json()["next_before"] is None


async def test_run_now_fires_through_the_claim(
    admin: tuple[httpx.AsyncClient, FastAPI], fired: asyncio.Event
) -> None:
    client, _ = admin
    response = await client.post("/admin/api/jobs/hourly_report/run", headers=AUTH)
    assert response.status_code == 202
    await asyncio.wait_for(fired.wait(), 10)


async def test_a_run_now_run_is_marked_manual_in_the_history(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database, fired: asyncio.Event
) -> None:
    client, _ = admin
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_runs (job_id, scope, slot, started_at, status,"
                " lateness_ms, pid, host) VALUES ('hourly_report', 'leader',"
                " now() - interval '1 hour', now(), 'ok', 0, 1, 'h')"
            )
        )
    await client.post("/admin/api/jobs/hourly_report/run", headers=AUTH)
    await asyncio.wait_for(fired.wait(), 10)
    runs = (await client.get("/admin/api/jobs/hourly_report/runs", headers=AUTH)).json()["runs"]
    assert [run["manual"] for run in runs] == [True, False]


async def test_jobs_describe_their_trigger_for_humans(
    admin: tuple[httpx.AsyncClient, FastAPI],
) -> None:
    client, _ = admin
    jobs = (await client.get("/admin/api/jobs", headers=AUTH)).json()
    assert jobs[0]["trigger_description"] == "every 1 h"


async def test_pause_and_resume(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database
) -> None:
    client, _ = admin
    assert (await client.post("/admin/api/jobs/hourly_report/pause", headers=AUTH)).json() == {
        "status": "paused"
    }
    jobs = (await client.get("/admin/api/jobs", headers=AUTH)).json()
    assert jobs[0]["paused"] is True
    await client.post("/admin/api/jobs/hourly_report/resume", headers=AUTH)
    jobs = (await client.get("/admin/api/jobs", headers=AUTH)).json()
    assert jobs[0]["paused"] is False


async def test_leader_names_this_process(admin: tuple[httpx.AsyncClient, FastAPI]) -> None:
    client, _ = admin
    leader = (await client.get("/admin/api/leader", headers=AUTH)).json()
    assert leader["pid"] == os.getpid()
    assert leader["application_name"] == f"scheduler-leader:{os.getpid()}"
    assert leader["standbys"] == 0
    assert leader["since"] is not None


async def _stuck_row(database: Database, key: str, status: str = "stuck") -> int:
    async with database.engine.begin() as conn:
        result = await conn.execute(
            text(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at, last_error)"
                " VALUES ('grants', :key, '{}', :status, 24, now(), now(), now(), 'HTTP 500')"
                " RETURNING id"
            ),
            {"key": key, "status": status},
        )
        return int(result.scalar_one())


async def _held_row(database: Database, key: str) -> int:
    """A pending row a live drain has claimed: its lease runs for another hour."""
    async with database.engine.begin() as conn:
        result = await conn.execute(
            text(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at, claimed_by)"
                " VALUES ('grants', :key, '{}', 'pending', 0, now() + interval '1 hour',"
                " now(), now(), gen_random_uuid()) RETURNING id"
            ),
            {"key": key},
        )
        return int(result.scalar_one())


async def test_outboxes_show_counts_and_stuck_rows_can_be_reset(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database
) -> None:
    client, _ = admin
    row = await _stuck_row(database, "k1")
    summary = (await client.get("/admin/api/outboxes", headers=AUTH)).json()
    assert summary[0]["name"] == "grants"
    assert summary[0]["counts"]["stuck"] == 1
    stuck = (
        await client.get("/admin/api/outboxes/grants/messages?status=stuck", headers=AUTH)
    ).json()
    assert [message["id"] for message in stuck] == [row]
    reset = await client.post(f"/admin/api/outboxes/grants/messages/{row}/reset", headers=AUTH)
    assert reset.json() == {"status": "pending"}
    summary = (await client.get("/admin/api/outboxes", headers=AUTH)).json()
    assert summary[0]["counts"] == {"pending": 1, "delivered": 0, "stuck": 0}


async def test_pending_rows_are_listed_with_their_last_error(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database
) -> None:
    client, _ = admin
    pending = await _stuck_row(database, "waiting", status="pending")
    await _stuck_row(database, "given-up")
    rows = (
        await client.get("/admin/api/outboxes/grants/messages?status=pending", headers=AUTH)
    ).json()
    assert [(row["id"], row["last_error"]) for row in rows] == [(pending, "HTTP 500")]
    assert rows[0]["next_attempt_at"] is not None


@pytest.mark.parametrize(
    ("method", "path", "status", "names"),
    [
        ("get", "/admin/api/jobs/nope/runs", 404, "nope"),
        ("post", "/admin/api/jobs/nope/run", 404, "nope"),
        ("post", "/admin/api/jobs/nope/pause", 404, "nope"),
        ("get", "/admin/api/jobs/bad%20id!/runs", 422, "job_id"),
        ("get", "/admin/api/jobs/hourly_report/runs?limit=0", 422, "limit"),
        ("get", "/admin/api/jobs/hourly_report/runs?before=abc", 422, "before"),
        ("get", "/admin/api/outboxes/nope/messages", 404, "nope"),
        ("get", "/admin/api/outboxes/grants/messages?status=delivered", 422, "status"),
        ("post", "/admin/api/outboxes/nope/messages/1/reset", 404, "nope"),
        ("post", "/admin/api/outboxes/grants/messages/abc/reset", 422, "message_id"),
        ("post", "/admin/api/outboxes/grants/messages/999999/reset", 404, "999999"),
    ],
)
async def test_bad_requests_get_a_4xx_that_names_the_problem(
    admin: tuple[httpx.AsyncClient, FastAPI],
    database: Database,
    method: str,
    path: str,
    status: int,
    names: str,
) -> None:
    client, _ = admin
    await _stuck_row(database, "known")
    response = await getattr(client, method)(path, headers=AUTH)
    assert response.status_code == status
    assert names in response.text


async def test_reset_of_a_delivered_row_is_a_409(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database
) -> None:
    client, _ = admin
    row = await _stuck_row(database, "done", status="delivered")
    response = await client.post(f"/admin/api/outboxes/grants/messages/{row}/reset", headers=AUTH)
    assert response.status_code == 409


async def test_reset_of_a_row_a_drain_holds_is_a_409_that_says_to_wait(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database
) -> None:
    client, _ = admin
    row = await _held_row(database, "in-flight")
    response = await client.post(f"/admin/api/outboxes/grants/messages/{row}/reset", headers=AUTH)
    assert response.status_code == 409
    assert "wait for the drain" in response.json()["detail"]


async def test_health_is_200_with_a_leader_and_fresh_jobs(
    admin: tuple[httpx.AsyncClient, FastAPI],
) -> None:
    client, _ = admin
    response = await client.get("/health/scheduler")
    assert response.status_code == 200
    assert response.json() == {
        "status": "ok",
        "schedule": "default",
        "refusal": None,
        "leader": True,
        "firing": True,
        "broken_jobs": [],
        "unclaimed_jobs": [],
        "stale_jobs": [],
        "jobs_not_led": [],
    }


async def test_health_is_503_listing_stale_job_ids(
    admin: tuple[httpx.AsyncClient, FastAPI],
) -> None:
    client, app = admin
    app.state.clock = FakeClock(app.state.clock.now() + timedelta(hours=3))
    response = await client.get("/health/scheduler")
    assert response.status_code == 503
    # Every app's hourly regent_retention job (app/retention.py) has not run either.
    assert response.json()["stale_jobs"] == ["hourly_report", "regent_retention"]
    assert "Hourly report" not in response.text


async def test_health_is_503_without_a_leader(settings: Settings) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/health/scheduler")
    assert response.status_code == 503
    assert response.json()["leader"] is False


@pytest.mark.parametrize("action", ["pause", "run"])
async def test_a_job_row_locked_past_the_wait_is_a_409_that_says_to_try_again(
    admin: tuple[httpx.AsyncClient, FastAPI], database: Database, action: str
) -> None:
    """Another transaction holds the job's row; the admin write waits for it and is cut
    off (here by a cancel, as a lock or statement timeout would): a 409, not a 500."""
    client, _ = admin
    async with database.engine.connect() as holder:
        await holder.execute(
            text("SELECT 1 FROM scheduler_jobs WHERE id = 'hourly_report' FOR UPDATE")
        )
        request = asyncio.create_task(
            client.post(f"/admin/api/jobs/hourly_report/{action}", headers=AUTH)
        )
        waiting = text(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        while not (await holder.execute(waiting)).first():
            assert not request.done(), (await request).text
            await asyncio.sleep(0.01)
        response = await request
        await holder.rollback()
    assert response.status_code == 409, response.text
    assert "try again" in response.json()["detail"]
