"""The app: health and readiness, and refusing to start off head."""

import httpx
import psycopg
import pytest
from fastapi import FastAPI

from app.db import DatabaseUnreachableError, SchemaNotAtHeadError
from app.localpg import free_port
from app.main import create_app
from app.settings import Settings, load_settings


class _Lifespan:
    """Runs an app's lifespan around a block, as uvicorn would."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._context = app.router.lifespan_context(app)

    async def __aenter__(self) -> httpx.AsyncClient:
        await self._context.__aenter__()
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://test"
        )
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        await self._context.__aexit__(None, None, None)


async def test_healthz_and_readyz_answer_200_at_head(settings: Settings) -> None:
    async with _Lifespan(create_app(settings)) as client:
        assert (await client.get("/healthz")).status_code == 200
        ready = await client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready"}


async def test_readyz_answers_503_with_the_reason_when_schema_falls_behind(
    settings: Settings, database_url: str
) -> None:
    async with _Lifespan(create_app(settings)) as client:
        with psycopg.connect(database_url, autocommit=True) as conn:
            # A revision this code knows, before head (an unknown one is a newer
            # release's: tests/test_schema_of_a_newer_release.py).
            conn.execute("UPDATE regent_alembic_version SET version_num = '0010'")
        ready = await client.get("/readyz")
        assert (await client.get("/healthz")).status_code == 200
    assert ready.status_code == 503
    assert "0010" in ready.json()["reason"]
    assert "python -m app migrate" in ready.json()["reason"]


async def test_start_up_refuses_a_database_behind_head(empty_database_url: str) -> None:
    settings = load_settings(_env_file=None, DATABASE_URL=empty_database_url)
    with pytest.raises(SchemaNotAtHeadError):
        async with _Lifespan(create_app(settings)):
            pass


async def test_start_up_names_an_unreachable_server() -> None:
    port = free_port()
    settings = load_settings(
        _env_file=None,
        DATABASE_URL=f"postgresql://u:p@127.0.0.1:{port}/app",
        DATABASE_CONNECT_TIMEOUT_SECONDS=3,
    )
    with pytest.raises(DatabaseUnreachableError, match=f"127.0.0.1:{port}"):
        async with _Lifespan(create_app(settings)):
            pass
