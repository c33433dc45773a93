"""Retention, report warm with /api/stats, the credit grants route, registration."""

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.jobs import JobDeps, build
from app.jobs.report_warm import warm_report_stats
from app.jobs.retention import delete_old_events
from app.main import create_app
from app.outbox import Message
from app.settings import Settings

from .conftest import NOW

API_TOKEN = "api-token-0123456789abcdef0123456789"


async def test_retention_deletes_in_batches_and_keeps_recent_events(
    database: Database, workspace: int
) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO tracking_events (workspace_id, name, occurred_at)"
                " SELECT :w, 'view', :old FROM generate_series(1, 2500)"
            ),
            {"w": workspace, "old": NOW - timedelta(days=400)},
        )
        await conn.execute(
            text(
                "INSERT INTO tracking_events (workspace_id, name, occurred_at)"
                " VALUES (:w, 'view', :recent)"
            ),
            {"w": workspace, "recent": NOW - timedelta(days=10)},
        )
    async with database.sessions() as session:
        assert await delete_old_events(session, NOW, 365) == 2500
        assert await delete_old_events(session, NOW, 365) == 0
    async with database.engine.connect() as conn:
        assert (await conn.execute(text("SELECT count(*) FROM tracking_events"))).scalar() == 1


def test_jobs_register_with_stable_ids_and_names(settings: Settings) -> None:
    jobs = build(settings)
    names = {spec.id: spec.name for spec in jobs.scheduler.jobs.values()}
    assert names["booking_reminders"] == "Send booking reminder SMS"
    assert names["standing_orders"] == "Generate standing order entries"
    assert names["subscription_charges"] == "Charge due subscriptions"
    assert names["outbox_credit_grants_drain"] == "Deliver queued credit_grants"
    assert names["report_warm"] == "Warm report statistics"
    assert not jobs.scheduler.jobs["stale_reservation_sweep"].leader_only
    assert jobs.scheduler.jobs["report_warm"].first_run == 30
    assert "updates_consumer" in jobs.scheduler.services


def test_report_warm_is_registered_only_when_enabled(settings: Settings) -> None:
    jobs = build(settings.model_copy(update={"REPORT_WARM_ENABLED": False}))
    assert "report_warm" not in jobs.scheduler.jobs


@pytest.fixture
async def client(
    settings: Settings,
) -> AsyncIterator[tuple[httpx.AsyncClient, FastAPI, list[Message]]]:
    received: list[Message] = []
    settings = settings.model_copy(update={"API_TOKEN": SecretStr(API_TOKEN)})
    jobs = build(settings, JobDeps())

    async def receive(message: Message) -> None:
        received.append(message)

    jobs.credit_grants.deliver = receive
    app = create_app(settings, jobs.scheduler)
    app.include_router(jobs.router)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport,
            base_url="http://test",
            headers={"Authorization": f"Bearer {API_TOKEN}"},
        ) as http:
            yield http, app, received


async def test_stats_are_read_from_the_warmed_table(
    client: tuple[httpx.AsyncClient, FastAPI, list[Message]], database: Database, workspace: int
) -> None:
    http, _, _ = client
    missing = await http.get("/api/stats", params={"workspace_id": workspace})
    assert missing.status_code == 404
    async with database.sessions() as session:
        assert await warm_report_stats(session, NOW) == 1
    stats = await http.get("/api/stats", params={"workspace_id": workspace})
    assert stats.status_code == 200
    assert stats.json()["events_30d"] == 0


async def test_credit_grant_commits_with_its_outbox_row_and_is_delivered_after_response(
    client: tuple[httpx.AsyncClient, FastAPI, list[Message]], database: Database, workspace: int
) -> None:
    http, _, received = client
    body = {"workspace_id": workspace, "amount": 500, "reference": "order-1"}
    response = await http.post("/api/credits/grants", json=body)
    assert response.status_code == 202
    assert response.json()["created"] is True
    # ASGITransport runs the background task before the response returns.
    async with asyncio.timeout(5):
        while not received:
            await asyncio.sleep(0.01)
    assert received[0].idempotency_key == "credit_grants:order-1"
    assert received[0].payload["grant_id"] == response.json()["id"]


async def test_a_reference_reused_for_the_same_grant_returns_the_existing_grant(
    client: tuple[httpx.AsyncClient, FastAPI, list[Message]], database: Database, workspace: int
) -> None:
    http, _, _ = client
    body = {"workspace_id": workspace, "amount": 500, "reference": "order-2"}
    first = await http.post("/api/credits/grants", json=body)
    # Reused with another amount it is a 409: tests/security/test_undeliverable_keys.py.
    again = await http.post("/api/credits/grants", json=body)
    assert again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "created": False}
    async with database.engine.connect() as conn:
        grants = await conn.execute(text("SELECT count(*) FROM credit_grants"))
        rows = await conn.execute(text("SELECT count(*) FROM outbox_messages"))
        assert (grants.scalar(), rows.scalar()) == (1, 1)


@pytest.mark.parametrize(
    ("change", "status", "field"),
    [
        ({"amount": 0}, 422, "amount"),
        ({"amount": -5}, 422, "amount"),
        ({"reference": None}, 422, "reference"),
        ({"workspace_id": 999999}, 404, "workspace_id"),
    ],
)
async def test_bad_grant_bodies_name_the_field(
    client: tuple[httpx.AsyncClient, FastAPI, list[Message]],
    workspace: int,
    change: dict[str, object],
    status: int,
    field: str,
) -> None:
    http, _, _ = client
    body = {"workspace_id": workspace, "amount": 500, "reference": "order-3"} | change
    body = {key: value for key, value in body.items() if value is not None}
    response = await http.post("/api/credits/grants", json=body)
    assert response.status_code == status
    assert field in response.text
