"""The FastAPI app: ``create_app(settings=None, scheduler=None)``; ``app`` is the default.

The lifespan opens the database, refuses to start when the schema is not at head or
when an outbox of its scheduler has a name another schedule's app drains in this
database (outbox names are per database), and starts the scheduler's supervisor. A
scheduler failure is logged and never blocks the API. At shutdown it stops the
scheduler (the shutdown grace), then waits for job bodies still running in threads,
which keep their running leases meanwhile, until they end or a second stop signal
arrives (see ``_wait_for_job_threads``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import multiprocess
from pydantic import BaseModel
from starlette.types import ASGIApp

from .admin import (
    AdminError,
    admin_error_response,
    api_router,
    health_router,
    index_router,
    page_router,
)
from .admin.headers import SecurityHeaders
from .db import Database, DatabaseError, asyncpg_dsn, verify_schema_at_head
from .http_errors import documented_error_bodies, validation_error_response
from .invocation import program
from .logging import configure_logging
from .metrics import instrument, measure_loop_lag
from .metrics_route import router as metrics_router
from .outbox import Outbox, OutboxError, UnregisteredDrainError
from .parent_death import worker_dies_with_parent
from .retention import register as register_retention
from .scheduler import DuplicateScheduleError, Scheduler, SchedulerConfig, SystemClock
from .scheduler.host_lock import default_runtime_dir
from .settings import Settings, SettingsError, load_settings
from .startup_refusal import OneLineStartupRefusal, refuse_start
from .stop_signal import on_stop_signal
from .user_migrations import configured_migrations

__all__ = ["DatabaseDep", "Readiness", "RegentAPI", "app", "create_app", "scheduler_config"]

logger = logging.getLogger("app")


def scheduler_config(settings: Settings) -> SchedulerConfig:
    """The scheduler's configuration, from the app's settings."""
    lock_url = settings.lock_database_url
    if lock_url is None:
        raise DatabaseError("DATABASE_URL is not set; the scheduler needs a database")
    return SchedulerConfig(
        lock_dsn=asyncpg_dsn(lock_url),
        zone=ZoneInfo(settings.TIMEZONE),
        lease_seconds=settings.LEASE_SECONDS,
        leader_tick_seconds=settings.LEADER_TICK_SECONDS,
        handover_grace_seconds=settings.HANDOVER_GRACE_SECONDS,
        shutdown_grace_seconds=settings.SHUTDOWN_GRACE_SECONDS,
        claim_ahead_seconds=settings.CLAIM_AHEAD_SECONDS,
        connect_timeout_seconds=settings.DATABASE_CONNECT_TIMEOUT_SECONDS,
        fail_closed=settings.is_production,
        schedule=settings.SCHEDULER_NAME,
        host_lock_dir=(settings.REGENT_RUNTIME_DIR or default_runtime_dir())
        if settings.HOST_LOCK_ENABLED
        else None,
    )


def _bind_outboxes(settings: Settings, database: Database, scheduler: Scheduler | None) -> None:
    """Bind our scheduler's outboxes to the database; refuse an outbox with no drain.

    An outbox on another scheduler belongs to another app in this process (tests).
    """
    lock_url = settings.lock_database_url
    assert lock_url is not None
    for outbox in Outbox.live():
        if outbox.scheduler is None:
            raise UnregisteredDrainError(
                f"outbox {outbox.name!r} has no drain on this app's scheduler, so a failed "
                "delivery would stay pending forever; create it with "
                "Outbox(..., scheduler=scheduler) or call outbox.register(scheduler)"
            )
        if outbox.scheduler is not scheduler:
            continue
        # LISTEN needs a session of its own: the lock URL bypasses pooling proxies.
        outbox.bind(
            database.engine,
            listen_dsn=asyncpg_dsn(lock_url),
            default_max_attempts=settings.OUTBOX_MAX_ATTEMPTS,
        )


async def _claim_outbox_names(settings: Settings, scheduler: Scheduler | None) -> None:
    """Claim the name of every outbox on our scheduler for its schedule; raises
    OutboxNameTakenError when an app of another schedule drains an outbox of that name
    in this database (its rows would be delivered by both)."""
    if scheduler is None:
        return
    schedule = scheduler.name if scheduler.name_is_set else settings.SCHEDULER_NAME
    for outbox in Outbox.live():
        if outbox.scheduler is scheduler:
            await outbox.claim_name(schedule)


async def _wait_for_job_threads(scheduler: Scheduler) -> None:
    """Wait for the job bodies still running in threads, until a second stop signal.

    A thread cannot be stopped, and uvicorn ends the process right after the lifespan
    (it raises the stop signal again), which would kill a body mid-way. Waiting here
    lets it end with its running lease renewed and its real outcome recorded. A process
    manager's kill ends it sooner (its lease then runs out), and a second SIGINT or
    SIGTERM stops the wait, as it stops Python's own wait for threads at exit.
    """
    again = asyncio.Event()
    restore = on_stop_signal(again.set)
    waiting = asyncio.ensure_future(scheduler.wait_for_threads())
    signalled = asyncio.ensure_future(again.wait())
    try:
        await asyncio.wait({waiting, signalled}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        restore()
        waiting.cancel()
        signalled.cancel()
        await asyncio.gather(waiting, signalled, return_exceptions=True)


def _database(request: Request) -> Database:
    database: Database = request.app.state.database
    return database


DatabaseDep = Annotated[Database, Depends(_database)]
"""A route's dependency on the app's Database (engines and session factories)."""


class Readiness(BaseModel):
    """The body of GET /readyz: ``ready``, or ``unavailable`` with the ``reason``."""

    status: Literal["ready", "unavailable"]
    reason: str | None = None


class RegentAPI(FastAPI):
    """FastAPI whose OpenAPI schema documents the error bodies as Regent's handlers
    answer them (app/http_errors.py), on every route, a user's own included, and whose
    every answer carries the security headers (app/admin/headers.py)."""

    def openapi(self) -> dict[str, Any]:
        """The schema, with the 400 and 422 bodies as app/http_errors.py documents them."""
        return documented_error_bodies(super().openapi())

    def build_middleware_stack(self) -> ASGIApp:
        """Starlette's stack inside SecurityHeaders: outside the error middleware, so a
        500 carries the security headers too (app/admin/headers.py)."""
        return SecurityHeaders(super().build_middleware_stack())


def create_app(settings: Settings | None = None, scheduler: Scheduler | None = None) -> FastAPI:
    """Build the app. Settings are read from the environment when not given.

    Start-up raises DatabaseError when DATABASE_URL is unset, the server cannot be
    reached (naming host and port), or the schema is not at head: Regent's, or the
    application's own migrations (REGENT_MIGRATIONS), naming the database, the chain,
    both revisions and the command that fixes it. An ASGI server reports such a refusal
    (and an outbox or schedule set up wrong) as its one-line message.
    """
    resolved = settings or load_settings()
    configure_logging(resolved.LOG_LEVEL)
    # The application's own migrations, found from the directory the app starts in up.
    users = configured_migrations(resolved)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            async with serving(app):
                yield
        except (DatabaseError, OutboxError, DuplicateScheduleError) as exc:
            # Told in one line by OneLineStartupRefusal, not as a traceback.
            refuse_start(app.state, exc)
            raise

    @asynccontextmanager
    async def serving(app: FastAPI) -> AsyncIterator[None]:
        # A worker of `uvicorn --workers N` (or `python -m app`) must not outlive its
        # supervisor: a SIGKILLed parent would leave it serving on the port.
        worker_dies_with_parent()
        database_url = resolved.database_url
        if database_url is None:
            raise DatabaseError(
                "DATABASE_URL is not set; set it to postgresql://user:pass@host:5432/db, "
                f"or run `{program()}`, which starts an embedded PostgreSQL"
            )
        database = Database.from_url(
            database_url, connect_timeout=resolved.DATABASE_CONNECT_TIMEOUT_SECONDS
        )
        try:
            await verify_schema_at_head(
                database.engine, timeout=resolved.DATABASE_CONNECT_TIMEOUT_SECONDS, users=users
            )
        except DatabaseError:
            await database.dispose()
            raise
        if users is not None and not users.exists:
            # A wheel carries no migrations/: a project deployed as one checks nothing of
            # its own tables here, and its first job that needs one fails instead.
            logger.info(
                "app.no_migrations_of_yours: no migrations of your own at %s "
                "(REGENT_MIGRATIONS=%r, looked from %s up): only Regent's schema was "
                "checked; ship your migrations with the app and set REGENT_MIGRATIONS to "
                "them, or set it empty if you have none (pid=%s)",
                users.directory,
                resolved.REGENT_MIGRATIONS,
                Path.cwd(),
                os.getpid(),
                extra={"action": "app.no_migrations_of_yours", "pid": os.getpid()},
            )
        app.state.database = database
        try:
            _bind_outboxes(resolved, database, scheduler)
            await _claim_outbox_names(resolved, scheduler)
        except Exception:
            await database.dispose()
            raise
        lag = asyncio.create_task(measure_loop_lag(), name="loop-lag")
        if scheduler is not None:
            try:
                await scheduler.start(
                    scheduler_config(resolved),
                    engine=database.engine,
                    sessions=database.sessions,
                    sync_sessions=database.sync_sessions,
                )
            except DuplicateScheduleError:
                # A set-up bug of this process, not a passing fault: refuse to start.
                await database.dispose()
                lag.cancel()
                raise
            except Exception:
                logger.exception("scheduler.start_failed: the API serves without a scheduler")
        # A worker told to stop must not promote while the server drains.
        restore_signals = on_stop_signal(scheduler.begin_stop) if scheduler else lambda: None
        try:
            yield
        finally:
            restore_signals()
            if scheduler is not None:
                await scheduler.stop()
                await _wait_for_job_threads(scheduler)
            lag.cancel()
            await asyncio.gather(lag, return_exceptions=True)
            await database.dispose()
            if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
                multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]

    # Swagger UI and ReDoc load their scripts from a CDN, without integrity: off unless
    # asked for (API_DOCS_ENABLED); /openapi.json is served either way.
    docs = resolved.API_DOCS_ENABLED
    app = RegentAPI(
        title="Regent",
        lifespan=lifespan,
        docs_url="/docs" if docs else None,
        redoc_url="/redoc" if docs else None,
    )
    app.state.settings = resolved
    app.state.scheduler = scheduler
    app.state.clock = SystemClock()
    app.state.zone = ZoneInfo(resolved.TIMEZONE)
    app.include_router(api_router)
    app.include_router(health_router)
    app.include_router(page_router)
    app.include_router(index_router)
    app.include_router(metrics_router)
    if scheduler is not None:
        # History stays bounded in every app (RUN_HISTORY_DAYS, ...): app/retention.py.
        if resolved.RETENTION_ENABLED:
            register_retention(scheduler, resolved)
        instrument(scheduler)
    app.add_exception_handler(AdminError, admin_error_response)
    app.add_exception_handler(RequestValidationError, validation_error_response)
    app.add_middleware(OneLineStartupRefusal)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """200 while the process lives."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        responses={
            200: {"model": Readiness, "description": "the database is reachable and at head"},
            503: {"model": Readiness, "description": "it is not: the reason"},
        },
    )
    async def readyz(database: DatabaseDep) -> JSONResponse:
        """200 when the database is reachable and at head; 503 with the reason otherwise."""
        try:
            await verify_schema_at_head(database.engine, timeout=5, users=users)
        except DatabaseError as exc:
            body = Readiness(status="unavailable", reason=str(exc))
            return JSONResponse(body.model_dump(), status_code=503)
        return JSONResponse({"status": "ready"})

    return app


def _default_app() -> FastAPI:
    """The app with its own jobs and routes, configured from the environment."""
    from .jobs import build, require_the_demos_tables

    try:
        require_the_demos_tables()
        settings = load_settings()
        jobs = build(settings)
    except SettingsError as exc:
        # Under plain `uvicorn app.main:app` an exception here prints uvicorn's import
        # traceback before the message; the message alone says what to fix.
        print(f"regent: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    app = create_app(settings, jobs.scheduler)
    app.include_router(jobs.router)
    return app


app: FastAPI  # the default app, built by __getattr__ below on first access


def __getattr__(name: str) -> FastAPI:
    # `app.main:app` is built on first access, so importing create_app builds nothing.
    if name == "app":
        global app
        app = _default_app()
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
