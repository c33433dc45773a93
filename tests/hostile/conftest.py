"""The whole default app (every job, every route, the admin on) for hostile input."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.jobs import build
from app.main import create_app
from app.scheduler import Role
from app.settings import Settings

from ..conftest import admin_session

TOKEN = "hostile-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Hostile:
    """The running app, a client signed in to the admin page, the sid of its session's
    path (/admin/s/<sid>/) and its CSRF value."""

    app: FastAPI
    client: httpx.AsyncClient
    sid: str
    csrf: str


@pytest.fixture
def hostile_settings(settings: Settings) -> Settings:
    # One token for both, so every probe sent with AUTH passes the admin's guard and
    # the example routes' guard and reaches the code behind them.
    return settings.model_copy(
        update={"ADMIN_TOKEN": SecretStr(TOKEN), "API_TOKEN": SecretStr(TOKEN)}
    )


@pytest.fixture
async def seeded(database: Database) -> None:
    """One workspace, one stuck outbox row: something for every route to read."""
    async with database.engine.begin() as conn:
        await conn.execute(text("INSERT INTO workspaces (id, name) VALUES (1, 'Acme')"))
        await conn.execute(
            text(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at, last_error) VALUES ('credit_grants',"
                " 'g-1', '{}', 'stuck', 24, now(), now(), now(), 'HTTP 400')"
            )
        )


@pytest.fixture
async def hostile(hostile_settings: Settings, seeded: None) -> AsyncIterator[Hostile]:
    """The default app (as `app.main:app` builds it), leading, signed in."""
    jobs = build(hostile_settings)
    app = create_app(hostile_settings, jobs.scheduler)
    app.include_router(jobs.router)
    async with app.router.lifespan_context(app):
        assert jobs.scheduler.supervisor is not None
        await jobs.scheduler.supervisor.wait_for_role(Role.LEADER)
        await jobs.scheduler.supervisor.wait_until_firing()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            base = await admin_session(client, TOKEN)
            page = await client.get(f"{base}/")
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text)
            assert csrf is not None, page.text
            yield Hostile(app, client, base.removeprefix("/admin/s/"), csrf.group(1))
