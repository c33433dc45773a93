"""Fixtures: a real PostgreSQL, a fresh migrated database per test, engines, settings."""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, asyncpg_dsn
from app.scheduler import Clock, FakeClock, Scheduler, SchedulerConfig, SystemClock
from app.scheduler.election import LockConnection
from app.scheduler.supervisor import Supervisor
from app.settings import Settings, load_settings
from app.testing import TestServer


@pytest.fixture(autouse=True)
def _forget_dead_outboxes() -> Iterator[None]:
    """Outboxes are registered per process by name; collect the ones a test dropped,
    so the next test may reuse a name and its app sees only its own outboxes."""
    yield
    gc.collect()


pytest_plugins = ["app.testing.plugin"]


@pytest.fixture(scope="session")
def pg_server(regent_server: TestServer) -> TestServer:
    """The session's PostgreSQL server: the shipped test kit's."""
    return regent_server


@pytest.fixture
def server(pg_server: TestServer) -> TestServer:
    """The server, for fault tests that restart or crash it (skipped on an external one)."""
    if not pg_server.can_restart:
        pytest.skip("TEST_DATABASE_URL is set: this test must restart the server")
    return pg_server


@pytest.fixture
def database_url(regent_database_url: str) -> str:
    """URL of a fresh database at head, dropped after the test (the kit's)."""
    return regent_database_url


@pytest.fixture
def empty_database_url(pg_server: TestServer) -> Iterator[str]:
    """URL of a fresh database with no schema at all."""
    url = pg_server.create_database(migrated=False)
    try:
        yield url
    finally:
        pg_server.drop_database(url)


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Test settings bound to this test's database, ignoring any .env file."""
    return load_settings(
        _env_file=None,
        DATABASE_URL=database_url,
        ENVIRONMENT="test",
        LEASE_SECONDS=6,
        LEADER_TICK_SECONDS=1,
        HANDOVER_GRACE_SECONDS=0,
        SHUTDOWN_GRACE_SECONDS=2,
    )


@pytest.fixture
def database(regent_database: Database) -> Database:
    """Engines and session factories on this test's database (the kit's)."""
    return regent_database


@pytest.fixture
def engine(database: Database) -> AsyncEngine:
    """The async engine of this test's database."""
    return database.engine


class StartScheduler(Protocol):
    def __call__(
        self, scheduler: Scheduler, *, clock: Clock | None = None, **overrides: Any
    ) -> Awaitable[Supervisor]: ...


@pytest.fixture
def config(database_url: str) -> SchedulerConfig:
    """Fast timings for tests: 6 s lease, 1 s tick, no handover grace; several
    Schedulers of one name in this process stand for several workers."""
    return SchedulerConfig(
        lock_dsn=asyncpg_dsn(database_url),
        lease_seconds=6,
        leader_tick_seconds=1,
        handover_grace_seconds=0,
        shutdown_grace_seconds=2,
        simulated_workers=True,
    )


class SkewedClock(SystemClock):
    """A host's real clock set ``skew`` off the other hosts' (and the database's)."""

    def __init__(self, skew: timedelta) -> None:
        self.skew = skew

    def now(self) -> datetime:
        return super().now() + self.skew


@pytest.fixture
def fake_clock() -> FakeClock:
    """A clock that moves only when the test says so."""
    return FakeClock()


@pytest.fixture
async def start_scheduler(
    database: Database, config: SchedulerConfig
) -> AsyncIterator[StartScheduler]:
    """Start a Scheduler's supervisor in this process; every one is stopped at teardown."""
    started: list[Scheduler] = []

    async def start(
        scheduler: Scheduler, *, clock: Clock | None = None, **overrides: Any
    ) -> Supervisor:
        started.append(scheduler)
        return await scheduler.start(
            replace(config, **overrides),
            engine=database.engine,
            sessions=database.sessions,
            sync_sessions=database.sync_sessions,
            clock=clock,
        )

    yield start
    await asyncio.gather(*(scheduler.stop() for scheduler in started))


# When a promotion elsewhere says it began: only operators read it.
_SINCE = datetime(2026, 1, 1, tzinfo=UTC)


async def promote_elsewhere(database_url: str) -> int:
    """A promotion on a lock connection of its own: take the free leader key, record the
    leadership (which moves the term, as every promotion does), let go. Returns the new
    term."""
    lock = await LockConnection.connect(asyncpg_dsn(database_url), lease_seconds=30)
    try:
        assert await lock.try_acquire(), "another session holds the leader key"
        term = await lock.record_leadership(pid=os.getpid(), host="elsewhere", since=_SINCE)
        assert term is not None, "the promotion's record did not match: key not held"
        return term
    finally:
        await lock.release()
