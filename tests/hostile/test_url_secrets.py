"""A credential in CREDIT_GRANTS_URL appears on no surface: not in the outbox row, the
admin API, the admin page, `python -m app outbox stuck`, nor any log line."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.jobs import build
from app.main import create_app
from app.redact import redact
from app.settings import Settings

from ..conftest import admin_session
from .conftest import AUTH, TOKEN

PASSWORD = "hunter2-pass"
QUERY_SECRET = "tok3n-in-query"


@pytest.fixture
async def refusing_receiver() -> AsyncIterator[int]:
    """A receiver that answers every request 400, echoing its request line, as some do."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = (await reader.readline()).decode("latin-1").strip()
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        body = f"bad request: {request_line}".encode()
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.close()
        await server.wait_closed()


def _secret_free(surface: str, content: str) -> None:
    assert PASSWORD not in content, f"{surface} shows the password: {content}"
    assert QUERY_SECRET not in content, f"{surface} shows the query token: {content}"


async def test_a_credential_in_the_receiver_url_leaks_nowhere(
    settings: Settings,
    database: Database,
    database_url: str,
    refusing_receiver: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    url = (
        f"http://grants:{PASSWORD}@127.0.0.1:{refusing_receiver}/grants"
        f"?token={QUERY_SECRET}&region=eu"
    )
    configured = settings.model_copy(
        update={
            "ADMIN_TOKEN": SecretStr(TOKEN),
            "API_TOKEN": SecretStr(TOKEN),
            "CREDIT_GRANTS_URL": url,
        }
    )
    async with database.engine.begin() as conn:
        await conn.execute(text("INSERT INTO workspaces (id, name) VALUES (1, 'Acme')"))
    jobs = build(configured)
    app = create_app(configured, jobs.scheduler)
    app.include_router(jobs.router)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            grant = {"workspace_id": 1, "amount": 5, "reference": "leak-1"}
            granted = await client.post("/api/credits/grants", json=grant, headers=AUTH)
            assert granted.status_code == 202, granted.text
            async with asyncio.timeout(30):
                while True:
                    async with database.engine.connect() as conn:
                        row = (
                            await conn.execute(
                                text("SELECT status, last_error FROM outbox_messages")
                            )
                        ).one()
                    if row.status == "stuck":
                        break
                    await asyncio.sleep(0.05)
            api = await client.get("/admin/api/outboxes/credit_grants/messages", headers=AUTH)
            base = await admin_session(client, TOKEN)
            page = await client.get(f"{base}/")
    cli = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", "outbox", "stuck"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "127.0.0.1" in row.last_error, "the error should still say where it went"
    _secret_free("the outbox row", row.last_error)
    assert api.status_code == 200 and api.json()
    _secret_free("the admin API", api.text)
    assert "leak-1" in page.text
    _secret_free("the admin page", page.text)
    assert cli.returncode == 0 and "credit_grants" in cli.stdout, cli.stderr
    _secret_free("`python -m app outbox stuck`", cli.stdout + cli.stderr)
    assert any("outbox.stuck" in record.getMessage() for record in caplog.records)
    _secret_free("the log", caplog.text)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:pw@host:8080/p?a=1", "http://***@host:8080/p?a=1"),
        ("https://user@host/p", "https://***@host/p"),
        ("https://host/p?token=t&x=1&api_key=k", "https://host/p?token=***&x=1&api_key=***"),
        (
            "https://host/p?Signature=s&X-Amz-Credential=c",
            "https://host/p?Signature=***&X-Amz-Credential=***",
        ),
        ("https://host/p", "https://host/p"),
    ],
)
def test_redact_hides_userinfo_and_secret_query_values(url: str, shown: str) -> None:
    assert redact(url) == shown


def test_redact_hides_every_url_and_bare_secret_in_a_message() -> None:
    message = "POST http://a:b@h/x?password=p answered 400: bad request: token=zzz"
    assert redact(message) == (
        "POST http://***@h/x?password=*** answered 400: bad request: token=***"
    )
