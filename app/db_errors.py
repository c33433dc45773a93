"""The database's errors, and how a driver's error is told: a failure to connect or log
in (the URL or the role: DatabaseUnreachableError naming DATABASE_URL) apart from a
statement the server refused (a revision's: MigrationFailedError naming its chain).
Every message is one line, with no password in it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .invocation import program
from .migration_env import NotConnectedError
from .redact import redact

__all__ = [
    "DatabaseError",
    "DatabaseUnreachableError",
    "MigrationFailedError",
    "connection_error",
    "first_line",
    "naming_the_chain",
    "sqlstate",
    "statement_failed",
]


class DatabaseError(Exception):
    """The database cannot be used as configured; the message says what to do."""


class DatabaseUnreachableError(DatabaseError):
    """No connection to the configured server could be made in time."""


class MigrationFailedError(DatabaseError):
    """A revision's statement failed on a database that answers: the revision or the
    schema it met is at fault, not the connection."""


# SQLSTATE classes of a failure to connect or log in: connection exception, invalid
# authorization, no such database, insufficient resources (too many connections), the
# server shutting down or starting. Any other SQLSTATE is a statement's failure.
_CONNECTION_SQLSTATES = ("08", "28", "3D", "53", "57P")
_INSUFFICIENT_PRIVILEGE = "42501"


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE the server answered ``exc`` with (through SQLAlchemy's wrapper or
    a driver's error); None when no server answered."""
    for error in (exc, getattr(exc, "orig", None), exc.__cause__):
        state = getattr(error, "sqlstate", None)
        if isinstance(state, str) and state:
            return state
    return None


def statement_failed(exc: BaseException) -> bool:
    """True when a server answered a statement with an error (``exc`` is no failure to
    connect or log in)."""
    if isinstance(exc, NotConnectedError):
        return False
    state = sqlstate(exc)
    return state is not None and not state.startswith(_CONNECTION_SQLSTATES)


def first_line(exc: BaseException) -> str:
    """``Class: first line`` of the driver's error under ``exc``, redacted."""
    # SQLAlchemy wraps the driver's error in several lines; the driver's first says it.
    cause = getattr(exc, "orig", None) or exc
    cause = cause.__cause__ or cause
    # A driver may quote the DSN it was given: never print its password.
    return f"{cause.__class__.__name__}: {redact((str(cause).strip().splitlines() or [''])[0])}"


def connection_error(exc: BaseException, target: str) -> DatabaseError | None:
    """The DatabaseError that says what to fix, for a failure to connect or log in;
    None for anything else (a bug, or a statement's failure, to be raised as it is)."""
    if statement_failed(exc):
        return None
    if isinstance(exc, NotConnectedError):
        exc = exc.args[0]
    if isinstance(exc, OSError | TimeoutError):
        return DatabaseUnreachableError(
            f"cannot reach PostgreSQL at {target} ({exc.__class__.__name__}: {exc}); "
            "check DATABASE_URL and that the server runs"
        )
    if exc.__class__.__module__.startswith(("asyncpg", "psycopg", "sqlalchemy")):
        return DatabaseUnreachableError(
            f"cannot use PostgreSQL at {target}: {first_line(exc)}; "
            "check DATABASE_URL (user, password, database name)"
        )
    return None


@contextlib.contextmanager
def naming_the_chain(chain: str, target: str) -> Iterator[None]:
    """Raise MigrationFailedError naming ``chain`` for a statement the server refused in
    the block; anything else passes as it is."""
    try:
        yield
    except Exception as exc:
        if not statement_failed(exc):
            raise
        if sqlstate(exc) == _INSUFFICIENT_PRIVILEGE:
            fix = (
                "the role in DATABASE_URL lacks a privilege they need: migrate as the "
                "database's owner (or a role granted CREATE on its schema)"
            )
        else:
            fix = "fix the revision (or the schema it met)"
        raise MigrationFailedError(
            f"{chain} failed on {target}: {first_line(exc)}; the revisions before it "
            f"are applied: {fix}, then run `{program()} migrate` again"
        ) from None
