"""The example routes move money and read any workspace: they answer only to
``Authorization: Bearer <API_TOKEN>``, and are off (404) while API_TOKEN is unset."""

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
from app.settings import Settings, SettingsError, load_settings

API_TOKEN = "api-token-0123456789abcdef0123456789"
ADMIN_TOKEN = "admin-token-0123456789abcdef0123456789"

OpenClient = Callable[[Settings], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def open_client() -> OpenClient:
    """A client of the default app (every job and route) built from given settings."""

    @asynccontextmanager
    async def open_(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
        jobs = build(settings)
        app = create_app(settings, jobs.scheduler)
        app.include_router(jobs.router)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return open_


async def _grants(database: Database) -> int:
    async with database.engine.connect() as conn:
        count = await conn.execute(text("SELECT count(*) FROM credit_grants"))
        return int(count.scalar_one())


def _requests(workspace: int) -> list[tuple[str, str, dict[str, object]]]:
    grant = {"workspace_id": workspace, "amount": 500, "reference": "auth-1"}
    return [
        ("POST", "/api/credits/grants", {"json": grant}),
        ("GET", "/api/stats", {"params": {"workspace_id": workspace}}),
    ]


async def test_the_example_routes_are_off_without_an_api_token(
    open_client: OpenClient, settings: Settings, database: Database, workspace: int
) -> None:
    async with open_client(settings) as client:
        for method, path, options in _requests(workspace):
            response = await client.request(method, path, **options)  # type: ignore[arg-type]
            assert response.status_code == 404, (path, response.text)
    assert await _grants(database) == 0


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer ", f"Bearer {ADMIN_TOKEN}", f"Bearer {API_TOKEN}x", f"Basic {API_TOKEN}"],
    ids=["none", "empty", "bearer-empty", "admin-token", "wrong-token", "wrong-scheme"],
)
async def test_the_example_routes_refuse_a_request_without_the_api_token(
    open_client: OpenClient,
    settings: Settings,
    database: Database,
    workspace: int,
    authorization: str | None,
) -> None:
    configured = settings.model_copy(
        update={"API_TOKEN": SecretStr(API_TOKEN), "ADMIN_TOKEN": SecretStr(ADMIN_TOKEN)}
    )
    headers = {} if authorization is None else {"Authorization": authorization}
    async with open_client(configured) as client:
        for method, path, options in _requests(workspace):
            response = await client.request(method, path, headers=headers, **options)  # type: ignore[arg-type]
            assert response.status_code == 401, (path, response.text)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert API_TOKEN not in response.text
    assert await _grants(database) == 0


async def test_the_example_routes_answer_to_the_api_token(
    open_client: OpenClient, settings: Settings, database: Database, workspace: int
) -> None:
    configured = settings.model_copy(update={"API_TOKEN": SecretStr(API_TOKEN)})
    headers = {"Authorization": f"Bearer {API_TOKEN}"}
    async with open_client(configured) as client:
        granted, stats = [
            await client.request(method, path, headers=headers, **options)  # type: ignore[arg-type]
            for method, path, options in _requests(workspace)
        ]
    assert granted.status_code == 202, granted.text
    assert stats.status_code == 404 and "report_warm" in stats.text  # not warmed yet
    assert await _grants(database) == 1


@pytest.mark.parametrize("value", ["", "   ", "short-token", " api-token-0123456789abcdef"])
def test_a_weak_api_token_is_refused_at_start_up(value: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(_env_file=None, API_TOKEN=value)
    assert "API_TOKEN" in str(raised.value)
    assert value.strip() == "" or value.strip() not in str(raised.value)
