"""Admin fixtures: the app of a scheduler, leading, served in this process with an
admin token; the admin app of a worker whose scheduler a test started; and the helpers
their tests share."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.main import create_app
from app.scheduler import Clock, Role, Scheduler, SystemClock
from app.scheduler.store import JobStore
from app.settings import Settings
from tests.forked_cli import run_app

from ..conftest import StartScheduler, admin_session, release

TOKEN = "truth-admin-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

Serve = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]
Worker = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def serve(settings: Settings) -> Serve:
    @asynccontextmanager
    async def serve(
        scheduler: Scheduler, *, clock: Clock | None = None, **overrides: Any
    ) -> AsyncIterator[httpx.AsyncClient]:
        """The app of ``scheduler``, leading; ``clock``: the admin's own clock (the
        scheduler keeps its own)."""
        update = {"ADMIN_TOKEN": SecretStr(TOKEN)} | overrides
        app = create_app(settings.model_copy(update=update), scheduler)
        if clock is not None:
            app.state.clock = clock
        async with app.router.lifespan_context(app):
            assert scheduler.supervisor is not None
            await scheduler.supervisor.wait_for_role(Role.LEADER)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return serve


@pytest.fixture
def admin_settings(settings: Settings) -> Settings:
    """The test settings with the admin token TOKEN."""
    return settings.model_copy(update={"ADMIN_TOKEN": SecretStr(TOKEN)})


@pytest.fixture
def worker(admin_settings: Settings) -> Worker:
    """An app process of its own (its own app and state, no scheduler), same database,
    as a client at ``client_ip``; ``clock``: the worker's own clock."""

    @asynccontextmanager
    async def start(
        client_ip: str = "203.0.113.7", *, clock: Clock | None = None
    ) -> AsyncIterator[httpx.AsyncClient]:
        app = create_app(admin_settings)
        if clock is not None:
            app.state.clock = clock
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, client=(client_ip, 40000))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return start


async def eventually_json(
    client: httpx.AsyncClient, path: str, condition: Callable[[Any], bool], **kwargs: Any
) -> Any:
    """The JSON body of GET ``path`` once ``condition`` holds for it (within 10 s)."""
    async with asyncio.timeout(10):
        while not condition(body := (await client.get(path, **kwargs)).json()):
            await asyncio.sleep(0.05)
    return body


async def set_lease(database: Database, until: str) -> None:
    """Give every job a leader run's running lease that ends at ``until`` (SQL), held
    by a process on another host."""
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE scheduler_jobs SET last_status = 'running', running_run_id = 1,"
                " running_since = now() - interval '1 hour', running_until = " + until + ","
                " running_pid = 999999, running_host = 'gone'"
            )
        )


async def beat_after_promotion(database: Database) -> None:
    """Return once the leader's tick wrote a heartbeat after its promotion's: a newer
    one than the first one read (both on the lease clock; the promotion's ``since`` is
    on the leader's own clock, which a test may set off)."""
    query = text("SELECT heartbeat_at FROM scheduler_leadership")
    first = None
    async with asyncio.timeout(10):
        while True:
            async with database.engine.connect() as conn:
                beat = (await conn.execute(query)).scalar()
            if first is None:
                first = beat
            elif beat is not None and beat > first:
                return
            await asyncio.sleep(0.05)


async def page_csrf(client: httpx.AsyncClient, base: str) -> str:
    """The CSRF field of the admin page under ``base``, which ``client``'s session
    cookie opens."""
    page = (await client.get(f"{base}/")).text
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match is not None, page
    return match.group(1)


async def signed_in(client: httpx.AsyncClient) -> tuple[str, str]:
    """Sign in to the admin page with TOKEN; the base of the session's page
    (admin_session) and the page's CSRF field."""
    base = await admin_session(client, TOKEN)
    return base, await page_csrf(client, base)


ADMIN_TOKEN = "worker-admin-token-0123456789abcdef"

WorkerAdmin = Callable[[Scheduler, Clock], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def worker_admin(settings: Settings) -> WorkerAdmin:
    """The admin app (API, page, /health/scheduler; token ADMIN_TOKEN) of the worker
    whose scheduler the test started on ``clock`` (start_scheduler): it reads that
    scheduler's jobs, and the lease clock as that worker does (a FakeClock's now), so
    a test moves what it reads with the clock it moves the scheduler with."""

    @asynccontextmanager
    async def admin(scheduler: Scheduler, clock: Clock) -> AsyncIterator[httpx.AsyncClient]:
        app = create_app(settings.model_copy(update={"ADMIN_TOKEN": SecretStr(ADMIN_TOKEN)}))
        async with app.router.lifespan_context(app):
            app.state.scheduler = scheduler
            app.state.clock = clock
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return admin


def app_command(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m app ARGS` on ``database_url``, its output captured (60 s at most)."""
    return run_app(list(args), {**os.environ, "DATABASE_URL": database_url})


async def execute(database: Database, sql: str, **params: object) -> None:
    """Run ``sql`` in a transaction of its own."""
    async with database.engine.begin() as conn:
        await conn.execute(text(sql), params)


async def stuck_row(database: Database, message_id: int, outbox: str = "grants") -> None:
    """A stuck row ``message_id`` of ``outbox``, after 24 attempts."""
    await execute(
        database,
        "INSERT INTO outbox_messages (id, outbox, key, payload, status, attempts,"
        " next_attempt_at, created_at, updated_at, last_error) OVERRIDING SYSTEM VALUE"
        " VALUES (:id, :outbox, :key, '{}', 'stuck', 24, now(), now(), now(), 'HTTP 400')",
        id=message_id,
        outbox=outbox,
        key=f"k-{message_id}",
    )


@pytest.fixture
async def unled_report(database: Database) -> Scheduler:
    """Job 'report' of schedule 'default', registered by a release whose app runs no
    more: no process leads the schedule or waits to. Returns that release's Scheduler,
    for a test to start it."""
    unled = release("report")
    rows = JobStore(database.engine, pid=0, host="previous-release")
    await rows.register_leader_jobs(unled.jobs.values(), SystemClock().now(), ZoneInfo("UTC"))
    return unled


@pytest.fixture
async def retired_old_report(database: Database, start_scheduler: StartScheduler) -> None:
    """Job 'old_report' retired: an older release registered it beside 'report', and
    the leader of a release that registers 'report' alone has promoted (and leads)."""
    rows = JobStore(database.engine, pid=0, host="previous-release")
    older = release("report", "old_report").jobs.values()
    await rows.register_leader_jobs(older, SystemClock().now(), ZoneInfo("UTC"))
    supervisor = await start_scheduler(release("report"))
    await supervisor.wait_until_firing()
