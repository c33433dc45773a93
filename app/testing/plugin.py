"""Pytest fixtures for testing your jobs against a real PostgreSQL.

Enable them with one line in your top-level ``conftest.py``::

    pytest_plugins = ["app.testing.plugin"]

Fixtures: ``regent_server`` (one throwaway server per session, or TEST_DATABASE_URL's),
``regent_database_url`` (a fresh database at head per test, cloned from a template),
``regent_database`` (its engines and sessions), ``regent_clock`` (a FakeClock).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from app.db import Database
from app.scheduler import FakeClock

from .server import TestServer, start_test_server

__all__ = ["regent_clock", "regent_database", "regent_database_url", "regent_server"]


@pytest.fixture(scope="session")
def regent_server() -> Iterator[TestServer]:
    """The session's PostgreSQL: started once, removed at the end of the session.

    Under pytest-xdist every worker is a session of its own, so each worker starts its
    own server (and on TEST_DATABASE_URL's, its own template): workers share nothing.
    """
    server = start_test_server()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def regent_database_url(regent_server: TestServer) -> Iterator[str]:
    """URL of a fresh database at head, dropped after the test."""
    url = regent_server.create_database()
    try:
        yield url
    finally:
        regent_server.drop_database(url)


@pytest.fixture
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
