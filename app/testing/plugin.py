"""Pytest fixtures for testing your jobs against a real PostgreSQL.

Enable them with one line in your top-level ``conftest.py``::

    pytest_plugins = ["app.testing.plugin"]

Fixtures: ``regent_server`` (one throwaway server per session, or TEST_DATABASE_URL's),
``regent_database_url`` (a database of its own per test, at head with empty tables: a
wiped one or a clone of a template that holds Regent's migrations and your own,
REGENT_MIGRATIONS), ``regent_database`` (its
engines and sessions), ``regent_clock`` (a FakeClock).

No pytest setting is needed: an ``async def`` test that uses one of these fixtures runs
on asyncio (pytest-asyncio, of the ``regent[test]`` extra) whatever ``asyncio_mode``
says.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from app.db import Database
from app.scheduler import FakeClock
from app.settings import Settings
from app.user_migrations import user_migrations

from .server import TestServer, start_test_server

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - only without the extra
    raise ImportError(
        "Regent's test kit needs pytest-asyncio: pip install 'regent[test]'"
    ) from None

__all__ = ["regent_clock", "regent_database", "regent_database_url", "regent_server"]

_FIXTURES = frozenset(__all__)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Mark an ``async def`` test that uses the kit's fixtures to run on asyncio, as
    ``@pytest.mark.asyncio`` would (pytest-asyncio's strict mode, its default, runs only
    marked tests; its auto mode marks them all)."""
    function = getattr(metafunc.function, "__func__", metafunc.function)
    if (
        inspect.iscoroutinefunction(function)
        and _FIXTURES & set(metafunc.fixturenames)
        and metafunc.definition.get_closest_marker("asyncio") is None
    ):
        # On the function: the test items are made from it after this hook.
        pytest.mark.asyncio(function)
        metafunc.definition.add_marker("asyncio")


@pytest.fixture(scope="session")
def regent_server(pytestconfig: pytest.Config) -> Iterator[TestServer]:
    """The session's PostgreSQL: started once, removed at the end of the session. Its
    template database holds Regent's migrations, then the project's own
    (REGENT_MIGRATIONS, default ``migrations``, found from the pytest root directory up;
    set in the environment but not there: SettingsError).

    Under pytest-xdist every worker is a session of its own, so each worker starts its
    own server (and on TEST_DATABASE_URL's, its own template): workers share nothing.
    """
    setting = os.environ.get(
        "REGENT_MIGRATIONS", Settings.model_fields["REGENT_MIGRATIONS"].default
    )
    users = user_migrations(
        setting, base=pytestconfig.rootpath, required="REGENT_MIGRATIONS" in os.environ
    )
    server = start_test_server(users=users)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def regent_database_url(regent_server: TestServer) -> Iterator[str]:
    """URL of a database of its own at head, empty (wiped or dropped after the test)."""
    url = regent_server.create_database()
    try:
        yield url
    finally:
        regent_server.release_database(url)


@pytest_asyncio.fixture(loop_scope="function")
async def regent_database(regent_database_url: str) -> AsyncIterator[Database]:
    """Engines and session factories on this test's database, disposed after it."""
    database = Database.from_url(regent_database_url)
    try:
        yield database
    finally:
        await database.dispose()


@pytest.fixture
def regent_clock() -> FakeClock:
    """A clock that moves only when the test says so (``advance``, ``set``)."""
    return FakeClock()
