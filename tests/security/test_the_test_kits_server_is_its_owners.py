"""The test kit's throwaway server is reached through its socket: a test's connection
(as a superuser, with a password) never goes to whatever answers on its TCP port, which
another local user can take while a fault test has the server down."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.db import Database
from app.localpg import free_port
from app.testing.server import TestServer

from .conftest import Impostor


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


def test_the_kits_tcp_url_sends_no_password_to_whatever_answers_on_its_port(
    server: TestServer, database_url: str, impostor: Callable[[int], Impostor]
) -> None:
    # As if another user had taken the port while a fault test had the server down.
    if not server.can_restart or server.local is None:
        pytest.skip("TEST_DATABASE_URL names a server of its own")
    url = server.tcp_url_for(str(make_url(database_url).database))
    port = free_port()
    fake = impostor(port)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url.replace(f":{server.local.port}/", f":{port}/"), connect_timeout=5)
    password = make_url(url).password
    assert password and password not in fake.captured()
