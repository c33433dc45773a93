"""A delayed message whose moment is ahead is shown as scheduled, apart from pending, by
the admin API, the page, the CLI and /metrics; once due, its wait counts from its
moment, not from when it was enqueued."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import text

from app.db import Database
from app.main import create_app
from app.settings import Settings

from ..conftest import admin_session
from .conftest import AUTH, TOKEN

_INSERT = text(
    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
    " deliver_at, created_at, updated_at)"
    " VALUES ('grants', :key, '{}', 'pending', 0,"
    " COALESCE(now() + CAST(:deliver_in AS interval), now()),"
    " now() + CAST(:deliver_in AS interval), now() - CAST(:age AS interval), now())"
    " RETURNING id"
)

HOUR = timedelta(hours=1)
WEEK = timedelta(days=7)


async def _row(
    database: Database,
    key: str,
    deliver_in: timedelta | None = None,
    age: timedelta = timedelta(0),
) -> int:
    """A pending row enqueued ``age`` ago, delayed to ``deliver_in`` from now (negative
    once due) or due at once, as enqueue(delay=...) writes it."""
    async with database.engine.begin() as conn:
        params = {"key": key, "deliver_in": deliver_in, "age": age}
        return int((await conn.execute(_INSERT, params)).scalar_one())


@pytest.fixture
async def client(admin_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(admin_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_the_api_counts_a_delayed_message_as_scheduled_not_pending(
    client: httpx.AsyncClient, database: Database
) -> None:
    await _row(database, "later", deliver_in=HOUR)
    await _row(database, "now")
    [summary] = (await client.get("/admin/api/outboxes", headers=AUTH)).json()
    assert summary["counts"] == {"pending": 1, "scheduled": 1, "delivered": 0, "stuck": 0}


async def test_the_api_lists_scheduled_messages_with_their_moment_apart_from_pending(
    client: httpx.AsyncClient, database: Database
) -> None:
    later = await _row(database, "later", deliver_in=2 * HOUR)
    sooner = await _row(database, "sooner", deliver_in=HOUR)
    due = await _row(database, "now")
    path = "/admin/api/outboxes/grants/messages"
    scheduled = (await client.get(f"{path}?status=scheduled", headers=AUTH)).json()
    assert [row["id"] for row in scheduled] == [sooner, later]
    assert all(row["deliver_at"] for row in scheduled)
    pending = (await client.get(f"{path}?status=pending", headers=AUTH)).json()
    assert [row["id"] for row in pending] == [due]


async def test_a_delayed_message_once_due_is_as_old_as_its_moment_not_its_enqueue(
    client: httpx.AsyncClient, database: Database
) -> None:
    await _row(database, "was-delayed", deliver_in=timedelta(seconds=-10), age=WEEK)
    [summary] = (await client.get("/admin/api/outboxes", headers=AUTH)).json()
    assert summary["counts"]["pending"] == 1
    assert 10 <= summary["oldest_pending_seconds"] < 60


async def test_a_scheduled_message_has_no_pending_age(
    client: httpx.AsyncClient, database: Database
) -> None:
    await _row(database, "later", deliver_in=HOUR, age=WEEK)
    [summary] = (await client.get("/admin/api/outboxes", headers=AUTH)).json()
    assert summary["oldest_pending_seconds"] is None


async def test_the_page_shows_scheduled_messages(
    client: httpx.AsyncClient, database: Database
) -> None:
    row = await _row(database, "later", deliver_in=HOUR)
    base = await admin_session(client, TOKEN)
    page = (await client.get(f"{base}/")).text
    outboxes = _table(page, "outboxes")
    assert re.search(r'class="num scheduled" data-label="scheduled">1<', outboxes)
    assert f'data-scheduled="{row}"' in _table(page, "scheduled")
    assert "later" not in _table(page, "pending")


async def test_metrics_count_scheduled_messages(
    client: httpx.AsyncClient, database: Database
) -> None:
    await _row(database, "later", deliver_in=HOUR)
    body = (await client.get("/metrics")).text
    assert 'regent_outbox_messages{outbox="grants",status="scheduled"} 1.0' in body
    assert 'regent_outbox_messages{outbox="grants",status="pending"} 0.0' in body


async def test_the_cli_lists_scheduled_messages(database: Database, database_url: str) -> None:
    await _row(database, "later-key", deliver_in=HOUR)
    listing = _app(database_url, "outbox", "list")
    assert listing.returncode == 0, listing.stderr
    header, row = listing.stdout.splitlines()[:2]
    assert dict(zip(header.split(), row.split(), strict=False))["scheduled"] == "1"
    scheduled = _app(database_url, "outbox", "scheduled", "grants")
    assert scheduled.returncode == 0, scheduled.stderr
    assert "later-key" in scheduled.stdout and "deliver_at" in scheduled.stdout
    assert _app(database_url, "outbox", "pending").stdout.strip() == "no pending rows"


def _app(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _table(html: str, table_id: str) -> str:
    match = re.search(rf'<table id="{table_id}"[^>]*>(.*?)</table>', html, re.DOTALL)
    assert match is not None, f"no table #{table_id}"
    return match.group(1)
