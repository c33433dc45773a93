"""Database access: engines, sessions and the schema-at-head check.

The app hands out an async engine (asyncpg) for request handlers and async jobs, and a
sync engine (psycopg 3) for jobs that run in a worker thread. Both are derived from the
one libpq URL in ``DATABASE_URL``.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, sessionmaker

from .db_errors import (
    DatabaseError,
    DatabaseUnreachableError,
    MigrationFailedError,
    connection_error,
    first_line,
    naming_the_chain,
    statement_failed,
)
from .invocation import program

if TYPE_CHECKING:
    # Only named here: importing it loads the app's settings (pydantic-settings), which
    # a process that runs the engine alone does without.
    from .user_migrations import UserMigrations

__all__ = [
    "REGENT_VERSION_TABLE",
    "Database",
    "DatabaseError",
    "DatabaseUnreachableError",
    "MigrationFailedError",
    "SchemaNotAtHeadError",
    "alembic_config",
    "async_url",
    "asyncpg_dsn",
    "describe_target",
    "head_revision",
    "known_revision",
    "migrate",
    "sync_url",
    "verify_schema_at_head",
]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
REGENT_VERSION_TABLE = "regent_alembic_version"
"""Where Regent keeps its schema's revision: a table of its own, so that an application's
own alembic history on the same database (the default ``alembic_version``) never meets
Regent's."""


class SchemaNotAtHeadError(DatabaseError):
    """The database schema is not at the revision this code expects: Regent's, or, with
    ``project`` set, the application's own migrations in that directory."""

    def __init__(
        self,
        current: str | None,
        head: str,
        target: str,
        project: Path | None = None,
        *,
        known: bool | None = None,
    ) -> None:
        self.current = current
        self.head = head
        self.project = project
        schema = "Regent's schema" if project is None else f"your migrations in {project}"
        if known is None:
            known = project is not None or current is None or known_revision(current)
        if not known:
            # Migrated by a newer release (this one was deployed back): no migration of
            # this code knows the way, up or down.
            release = "Regent" if project is None else "your app"
            fix = (
                f"this code does not know revision {current}, so a newer release of "
                f"{release} migrated it: deploy that release or a newer one"
            )
        else:
            fix = f"run `{program()} migrate`"
        if current:
            at = f"at revision {current}"
        elif project is None:
            # No row in regent_alembic_version: a new database, or one an older Regent
            # migrated (its revision in alembic_version), which `migrate` moves over.
            at = "at no revision (a new database, or one an older Regent migrated)"
        else:
            at = "at no revision"
        super().__init__(
            f"the database at {target} (DATABASE_URL): {schema} {at} but this code needs "
            f"head {head or '<empty>'}; {fix}"
        )


def _with_driver(url: str, driver: str) -> str:
    parsed = make_url(url)
    if driver == "asyncpg" and "sslmode" in parsed.query:
        # asyncpg.connect() takes libpq's sslmode values under the name ssl.
        parsed = parsed.difference_update_query(["sslmode"]).update_query_dict(
            {"ssl": parsed.query["sslmode"]}
        )
    return parsed.set(drivername=f"postgresql+{driver}").render_as_string(hide_password=False)


def async_url(url: str) -> str:
    """SQLAlchemy URL for the asyncpg driver, from any postgres:// or postgresql:// URL
    (libpq's ``sslmode`` becomes asyncpg's ``ssl``)."""
    return _with_driver(url, "asyncpg")


def sync_url(url: str) -> str:
    """SQLAlchemy URL for the psycopg 3 driver, from any postgres:// or postgresql:// URL."""
    return _with_driver(url, "psycopg")


def asyncpg_dsn(url: str) -> str:
    """Plain libpq DSN (``postgresql://``) that asyncpg.connect accepts."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


def alembic_config(database_url: str | None = None) -> Config:
    """Alembic configuration for Regent's migrations (shipped inside the package, so an
    installed wheel migrates as a checkout does), optionally bound to a URL."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if database_url is not None:
        # configparser treats % as interpolation; a password may contain one.
        config.set_main_option("sqlalchemy.url", async_url(database_url).replace("%", "%%"))
    return config


@functools.cache
def head_revision() -> str:
    """The head revision of the migrations shipped with this code."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "app/migrations/versions holds no revision"
    return head


def known_revision(revision: str, config: Config | None = None) -> bool:
    """True when ``revision`` is one of the migrations shipped with this code: Regent's,
    or those of the alembic project ``config`` names (the application's own)."""
    try:
        script = ScriptDirectory.from_config(config or alembic_config())
        return script.get_revision(revision) is not None
    except CommandError:
        return False


def _current_revision(connection: Connection) -> str | None:
    context = MigrationContext.configure(connection, opts={"version_table": REGENT_VERSION_TABLE})
    return context.get_current_revision()


def describe_target(url: str) -> str:
    """``host:port/database`` of a URL (host a socket's directory for a socket), with
    no credentials: safe to log."""
    parsed = make_url(url)
    # A Unix socket's directory comes in the query (``?host=/path``).
    host = parsed.host or parsed.query.get("host") or "localhost"
    port = parsed.port or parsed.query.get("port") or 5432
    return f"{host}:{port}/{parsed.database or ''}"


def migrate(database_url: str, users: UserMigrations | None = None) -> None:
    """Upgrade the database to head: Regent's migrations, then the application's own
    (``users``, when its project exists), each run holding the migration advisory lock.

    Two runs at once are safe: the second waits for the first, then finds nothing to do.
    Raises DatabaseUnreachableError naming the target when it cannot connect or log in,
    SchemaNotAtHeadError for a database a newer release of Regent migrated (its
    revision unknown to this code, which cannot migrate it either way), and
    MigrationFailedError naming the chain when the server refused a revision's statement
    (the revisions before it stay applied).
    """
    target = describe_target(database_url)
    try:
        try:
            with naming_the_chain("Regent's migrations", target):
                command.upgrade(alembic_config(database_url), "head")
        except CommandError:
            current = _read_current_revision(database_url)
            if current is None or known_revision(current):
                raise
            raise SchemaNotAtHeadError(current, head_revision(), target) from None
        if users is not None and users.exists:
            # psycopg: an env.py of the user's own making may be sync or async.
            chain = f"your migrations in {users.directory}"
            with naming_the_chain(chain, target):
                try:
                    command.upgrade(users.config(sync_url(database_url)), "heads")
                except CommandError as exc:
                    # Alembic's own refusal: the database at a revision the project does
                    # not have (a newer release of the app migrated it), or a bad chain.
                    raise MigrationFailedError(
                        f"{chain} cannot migrate {target}: {exc}; if a newer release of "
                        "your app migrated it, deploy that release or a newer one"
                    ) from None
    except MigrationFailedError:
        raise
    except Exception as exc:
        error = connection_error(exc, target)
        if error is None:
            raise
        raise error from None


def _read_current_revision(database_url: str) -> str | None:
    """Regent's revision of the database at ``database_url`` (psycopg, as a thread job
    connects)."""
    engine = create_engine(sync_url(database_url))
    try:
        with engine.connect() as connection:
            return _current_revision(connection)
    finally:
        engine.dispose()


async def verify_schema_at_head(
    engine: AsyncEngine, *, timeout: float = 10, users: UserMigrations | None = None
) -> None:
    """Return when the database is at the head revision of Regent's migrations and, when
    ``users`` names an existing project, at the heads of the application's own.

    Raises SchemaNotAtHeadError naming the chain, the current and head revisions
    otherwise, and DatabaseUnreachableError naming host and port when no connection is
    made in ``timeout`` seconds.
    """
    target = describe_target(engine.url.render_as_string())
    users = users if users is not None and users.exists else None
    try:
        async with asyncio.timeout(timeout), engine.connect() as connection:
            current = await connection.run_sync(_current_revision)
            users_current = await connection.run_sync(users.current) if users else set()
    except TimeoutError:
        raise DatabaseUnreachableError(
            f"cannot reach PostgreSQL at {target} within {timeout:g} s; "
            "check DATABASE_URL and that the server runs"
        ) from None
    except Exception as exc:
        error = connection_error(exc, target)
        if error is None and statement_failed(exc):
            error = DatabaseError(
                f"cannot read the schema's revisions at {target}: {first_line(exc)}; "
                "check that DATABASE_URL's user may read them (regent_alembic_version, "
                "and alembic_version for your own)"
            )
        if error is None:
            raise
        raise error from None
    head = head_revision()
    if current != head:
        raise SchemaNotAtHeadError(current, head, target)
    if users is not None and users_current != (users_head := users.heads()):
        config = users.config()
        raise SchemaNotAtHeadError(
            ", ".join(sorted(users_current)),
            ", ".join(sorted(users_head)),
            target,
            users.directory,
            known=all(known_revision(revision, config) for revision in users_current),
        )


@dataclass
class Database:
    """The app's engines and session factories, built from one URL (kept out of the
    repr: it carries the password)."""

    url: str = field(repr=False)
    engine: AsyncEngine
    sync_engine: Engine
    sessions: async_sessionmaker[AsyncSession]
    sync_sessions: sessionmaker[Session]

    @classmethod
    def from_url(cls, url: str, *, connect_timeout: float = 10, pool_size: int = 5) -> Database:
        """Engines for ``url``; nothing connects until first use."""
        engine = create_async_engine(
            async_url(url),
            pool_size=pool_size,
            pool_pre_ping=True,
            connect_args={"timeout": connect_timeout},
        )
        sync_engine = create_engine(
            sync_url(url),
            pool_size=pool_size,
            pool_pre_ping=True,
            connect_args={"connect_timeout": max(1, int(connect_timeout))},
        )
        return cls(
            url=url,
            engine=engine,
            sync_engine=sync_engine,
            sessions=async_sessionmaker(engine, expire_on_commit=False),
            sync_sessions=sessionmaker(sync_engine, expire_on_commit=False),
        )

    async def dispose(self) -> None:
        """Close every pooled connection of both engines."""
        await self.engine.dispose()
        self.sync_engine.dispose()
