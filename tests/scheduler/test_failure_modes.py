"""When the lock cannot be had: production fails closed, elsewhere the scheduler fails
open (claims still fire each slot once), and an unreachable lock server is retried."""

import asyncio
import logging

import httpx
import pytest
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import asyncpg_dsn
from app.localpg import free_port
from app.main import create_app
from app.scheduler import FakeClock, JobContext, Role, Scheduler, ServiceContext, every
from app.settings import Settings

from .conftest import StartScheduler, wait_for_runs


def _missing_database(database_url: str) -> str:
    url = make_url(database_url).set(database="no_such_database")
    return asyncpg_dsn(url.render_as_string(hide_password=False))


async def test_production_lock_check_error_starts_no_scheduler(
    start_scheduler: StartScheduler, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.scheduler")
    clock = FakeClock()
    scheduler = Scheduler()
    ran = asyncio.Event()

    @scheduler.job(every(seconds=10), id="guarded")
    async def guarded(ctx: JobContext) -> None:
        ran.set()

    supervisor = await start_scheduler(
        scheduler, clock=clock, lock_dsn=_missing_database(database_url), fail_closed=True
    )
    # Parked in its backoff: one sleeper, and it is not leading.
    await clock.wait_for_sleepers(1)
    assert supervisor.role is Role.STANDBY
    assert any("scheduler.fail_closed" in r.getMessage() for r in caplog.records)
    clock.advance(60)
    await clock.wait_for_sleepers(1)
    assert not ran.is_set()


async def test_elsewhere_a_lock_check_error_fails_open_and_still_fires(
    start_scheduler: StartScheduler, database_url: str, engine: object
) -> None:
    clock = FakeClock()
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="unguarded")
    async def unguarded(ctx: JobContext) -> None:
        return None

    supervisor = await start_scheduler(
        scheduler, clock=clock, lock_dsn=_missing_database(database_url), fail_closed=False
    )
    await supervisor.wait_for_role(Role.UNGUARDED)
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    history = await wait_for_runs(engine, "unguarded", 1)  # type: ignore[arg-type]
    assert history[0][0] == "ok"


async def test_unreachable_lock_server_is_retried_while_the_api_serves(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="app.scheduler")
    dead = f"postgresql://regent@127.0.0.1:{free_port()}/regent"
    app = create_app(settings.model_copy(update={"LOCK_DATABASE_URL": dead}), Scheduler())
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/readyz")).status_code == 200
        scheduler: Scheduler = app.state.scheduler
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.STANDBY)
    assert any("scheduler.lock_unreachable" in r.getMessage() for r in caplog.records)


async def test_an_unguarded_worker_starts_no_service(
    start_scheduler: StartScheduler, database_url: str, engine: AsyncEngine
) -> None:
    """Services (long-poll consumers) must run on at most one process: never unguarded."""
    clock = FakeClock()
    scheduler = Scheduler()
    service_started = asyncio.Event()
    scheduler.job(every(seconds=10), id="unguarded")(lambda ctx: None)

    @scheduler.service(id="long_poll")
    async def long_poll(ctx: ServiceContext) -> None:
        service_started.set()
        await asyncio.Event().wait()

    supervisor = await start_scheduler(
        scheduler, clock=clock, lock_dsn=_missing_database(database_url), fail_closed=False
    )
    await supervisor.wait_for_role(Role.UNGUARDED)
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await wait_for_runs(engine, "unguarded", 1)
    assert not service_started.is_set()
