"""The test kit's throwaway server is reached through its socket: a test's connection
(as a superuser, with a password) never goes to whatever answers on its TCP port, which
another local user can take while a fault test has the server down."""

from __future__ import annotations

import os
import stat

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.db import Database
from app.testing.server import TestServer


async def test_a_tests_database_connection_goes_through_the_servers_socket(
    server: TestServer, database: Database
) -> None:
    if not server.can_restart:
        pytest.skip("TEST_DATABASE_URL names a server of its own")
    async with database.engine.connect() as conn:
        # NULL on a Unix socket; 127.0.0.1 over TCP.
        address = (await conn.execute(text("SELECT inet_server_addr()"))).scalar_one()
    assert address is None


def test_the_kits_socket_directory_only_the_servers_account_enters(
    server: TestServer, database_url: str
) -> None:
    if not server.can_restart:
        pytest.skip("TEST_DATABASE_URL names a server of its own")
    socket_dir = make_url(database_url).query["host"]
    assert isinstance(socket_dir, str)
    mode = os.stat(socket_dir)
    assert stat.S_IMODE(mode.st_mode) & 0o077 == 0, oct(mode.st_mode)
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT inet_server_addr()").fetchone() == (None,)
