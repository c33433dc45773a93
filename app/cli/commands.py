"""The operator commands put together: their sub-parsers, the database they reach
(DATABASE_URL, else a running `python -m app`'s embedded server), and the run of one."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from ..db import DatabaseUnreachableError, async_url, verify_schema_at_head
from ..embedded import default_data_dir, embedded_url, socket_path
from ..invocation import program
from ..scheduler import Clock, SystemClock
from ..settings import Settings
from . import jobs, leader, outbox, prune

__all__ = ["COMMANDS", "add_commands", "database_url", "main_async", "run_command"]


def add_commands(commands: Any) -> None:
    """Add the jobs, outbox, leader and prune sub-commands to an argparse sub-parser set.

    Every read command takes ``--json`` (rows as JSON, timestamps ISO-8601) for scripts,
    after it or its sub-command; `python -m app` takes it before the command too (see
    options.add_json).
    """
    jobs.add_parser(commands)
    outbox.add_parser(commands)
    leader.add_parser(commands)
    prune.add_parser(commands)


COMMANDS: dict[
    str, Callable[[AsyncEngine, argparse.Namespace, Settings, Clock], Awaitable[str]]
] = {
    "jobs": jobs.execute,
    "outbox": outbox.execute,
    "leader": leader.execute,
    "prune": prune.execute,
}


def database_url(settings: Settings) -> str:
    """DATABASE_URL, or the embedded server a running `python -m app` listens on (with
    the password kept in its data directory)."""
    if settings.database_url is not None:
        return settings.database_url
    data_dir = settings.REGENT_DATA_DIR or default_data_dir()
    return embedded_url(data_dir, settings.REGENT_PG_PORT)


async def run_command(
    settings: Settings, args: argparse.Namespace, *, clock: Clock | None = None
) -> str:
    """Run an operator command; returns what to print. Raises AdminError, DatabaseError
    or UsageError with a message that says what was wrong.

    ``clock`` is the operator's machine's (SystemClock by default). It stamps a run-now
    request; every lease and due time is read on the lease clock (app/scheduler/clock.py),
    the database server's under the system clock, never on the operator's machine."""
    clock = clock or SystemClock()
    # --json is left unset where it was not given (options.add_json): unset is false.
    args = argparse.Namespace(**({"json": False} | vars(args)))
    if args.command == "outbox":
        outbox.check_usage(args)
    url = database_url(settings)
    engine = create_async_engine(async_url(url))
    try:
        try:
            await verify_schema_at_head(engine, timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS)
        except DatabaseUnreachableError as exc:
            if settings.DATABASE_URL is not None:
                raise
            data_dir = settings.REGENT_DATA_DIR or default_data_dir()
            raise DatabaseUnreachableError(
                "no embedded PostgreSQL answers on "
                f"{socket_path(data_dir, settings.REGENT_PG_PORT)} (REGENT_DATA_DIR, "
                f"REGENT_PG_PORT): {exc}. Start `{program()}` first, set REGENT_PG_PORT "
                "to the port it was started with, or set DATABASE_URL"
            ) from None
        return await COMMANDS[args.command](engine, args, settings, clock)
    finally:
        await engine.dispose()


def main_async(settings: Settings, args: argparse.Namespace) -> str:
    """Synchronous entry for __main__."""
    return asyncio.run(run_command(settings, args))
