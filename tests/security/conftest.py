"""Security fixtures: the default app's routes (admin page and API, the example API)
served in this process as a client at a given address, and the sign-in form."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.jobs import build
from app.main import create_app
from app.settings import Settings

ADMIN_TOKEN = "security-admin-token-0123456789abcdef"
API_TOKEN = "security-api-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
API = {"Authorization": f"Bearer {API_TOKEN}"}

Open = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def security_settings(settings: Settings) -> Settings:
    """The test settings with both tokens set."""
    return settings.model_copy(
        update={"ADMIN_TOKEN": SecretStr(ADMIN_TOKEN), "API_TOKEN": SecretStr(API_TOKEN)}
    )


@pytest.fixture
async def workspace(database: Database) -> int:
    """A workspace that credit grants may name."""
    async with database.engine.begin() as conn:
        await conn.execute(text("INSERT INTO workspaces (id, name) VALUES (1, 'Acme')"))
    return 1


@pytest.fixture
def open_app(security_settings: Settings) -> Open:
    """A worker of the default app (admin page and API, the example routes; no
    scheduler), its own app and state over the test database, as a client at
    ``client_ip``."""

    @asynccontextmanager
    async def open_(client_ip: str = "203.0.113.7") -> AsyncIterator[httpx.AsyncClient]:
        jobs = build(security_settings)
        app = create_app(security_settings)
        app.include_router(jobs.router)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, client=(client_ip, 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return open_
