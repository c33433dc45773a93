"""A throwaway PostgreSQL for tests, or the server TEST_DATABASE_URL names.

Each test gets a database of its own at head with empty tables: one a previous test gave
back, wiped (app/testing/reuse.py), or else a clone of a template migrated once to head
(Regent's migrations, then the project's own).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from app.db import migrate
from app.localpg import LocalPostgres, free_port
from app.user_migrations import UserMigrations

from .reuse import DatabasePool

__all__ = ["TestServer", "start_test_server"]

_TEST_ROLE = "regent_test"


class TestServer:
    """One PostgreSQL server for a whole test session.

    Without ``external_url`` it initdb's and starts a local server in a temporary
    directory (as root, as the ``postgres`` account: initdb refuses root) and deletes it
    at close(). Tests log in through the server's socket as a superuser of their own
    (``regent_test``, its password kept in memory only; fault tests need a superuser's
    powers); the server listens on 127.0.0.1 too, for the few that need a TCP address
    (``tcp_url_for``). With ``external_url`` it creates and drops only its own databases there.
    The template holds Regent's migrations and then ``users``' (when given).
    """

    __test__ = False

    def __init__(self, external_url: str | None, users: UserMigrations | None = None) -> None:
        self.run_id = uuid.uuid4().hex[:8]
        self.external_url = external_url
        self.local: LocalPostgres | None = None
        self._tmp: Path | None = None
        if external_url is None:
            self._tmp = Path(tempfile.mkdtemp(prefix="regent-test-"))
            # As root the server runs as another user, who must reach the directory.
            self._tmp.chmod(0o755)
            self.local = LocalPostgres(self._tmp / "data", port=free_port(), fsync=False, tcp=True)
            self.local.start()
            self._password = secrets.token_urlsafe(32)
            with psycopg.connect(self.local.superuser_conninfo("postgres")) as conn:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
                        sql.Identifier(_TEST_ROLE), sql.Literal(self._password)
                    )
                )
        self.template = f"regent_tpl_{self.run_id}"
        try:
            self._execute(f'CREATE DATABASE "{self.template}"')
            migrate(self.url_for(self.template), users)
            self._pool = DatabasePool(self.template, self.url_for, self._new_name)
        except BaseException:
            self.close()
            raise

    @property
    def can_restart(self) -> bool:
        """Only the server this suite started may be stopped, crashed or restarted."""
        return self.local is not None

    def url_for(self, database: str) -> str:
        """libpq URL of ``database`` on this server: through the local server's socket
        (in its data directory, which only its account enters), so that nothing a test
        does with it sends the password to whatever answers on a TCP port."""
        if self.local is not None:
            socket_dir = quote(str(self.local.data_dir.absolute()), safe="")
            return (
                f"postgresql://{_TEST_ROLE}:{self._password}@/{database}"
                f"?host={socket_dir}&port={self.local.port}"
            )
        assert self.external_url is not None
        return make_url(self.external_url).set(database=database).render_as_string(False)

    def tcp_url_for(self, database: str) -> str:
        """libpq URL of ``database`` on 127.0.0.1, for the few tests that need a TCP
        address (a pooler in front, a host spelled out). Only the local server has one;
        an external one's URL is returned as it is. It asks libpq to refuse any
        authentication weaker than SCRAM (``require_auth``), so whatever else answers on
        the port (another user's, while a fault test has the server down) is sent no
        password; asyncpg knows no such parameter: drop it for asyncpg, knowing that."""
        if self.local is None:
            return self.url_for(database)
        return (
            f"postgresql://{_TEST_ROLE}:{self._password}@127.0.0.1:{self.local.port}/{database}"
            "?require_auth=scram-sha-256"
        )

    @property
    def admin_url(self) -> str:
        """URL of the maintenance database, for CREATE and DROP DATABASE."""
        return self.url_for("postgres")

    def create_database(self, *, migrated: bool = True) -> str:
        """A database of its own for one test: at head and empty (a database given back
        and wiped, or a clone of the migrated template), or with no schema at all
        (``migrated=False``); returns its URL. Give it back with ``release_database``."""
        if migrated and (lent := self._pool.lend()) is not None:
            return self.url_for(lent)
        name = self._new_name()
        template = f' TEMPLATE "{self.template}"' if migrated else ""
        self._execute(f'CREATE DATABASE "{name}"{template}')
        return self.url_for(name)

    def release_database(self, url: str) -> None:
        """Give back a database from ``create_database``: its sessions are ended, and it
        is wiped for the next test when nothing else tells it from a fresh clone (see
        app/testing/reuse.py), else dropped. Its URL stops working either way."""
        name = make_url(url).database
        assert name is not None
        with psycopg.connect(self.admin_url, autocommit=True) as admin:
            self._pool.give_back(name, admin)

    def _new_name(self) -> str:
        return f"regent_t_{self.run_id}_{uuid.uuid4().hex[:10]}"

    def drop_database(self, url: str) -> None:
        """Drop a test database, closing whatever still holds a connection to it."""
        name = make_url(url).database
        self._execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def restart(self) -> None:
        """Clean stop and start, same port and data directory."""
        assert self.local is not None, "only a server the suite started can restart"
        self.local.restart()

    def crash(self) -> None:
        """SIGKILL the postmaster and its backends."""
        assert self.local is not None, "only a server the suite started can crash"
        self.local.crash()

    def replica(self) -> LocalPostgres:
        """A started streaming replica of this server (stop it when done)."""
        assert self.local is not None and self._tmp is not None
        replica = self.local.replica(
            self._tmp / f"replica-{uuid.uuid4().hex[:6]}", port=free_port()
        )
        replica.start()
        return replica

    def start(self) -> None:
        """Start again after crash()."""
        assert self.local is not None
        self.local.start()

    def close(self) -> None:
        """Drop what this run created; stop and delete a server this suite started."""
        if self.local is not None:
            self.local.stop()
            if self._tmp is not None:
                shutil.rmtree(self._tmp, ignore_errors=True)
            return
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s",
                (f"regent_%_{self.run_id}%",),
            ).fetchall()
            for (name,) in rows:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def _execute(self, statement: str) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement.encode())


def start_test_server(users: UserMigrations | None = None) -> TestServer:
    """The server for this session: TEST_DATABASE_URL's when set, else a local one; its
    template holds Regent's migrations and ``users``' own.

    Raises LocalPostgresError when no PostgreSQL binaries can be found (the `embedded`
    extra ships them).
    """
    return TestServer(os.environ.get("TEST_DATABASE_URL") or None, users)
