"""`python -m app`: serve (the default), migrate, and the operator commands.

    python -m app [serve] [--host 127.0.0.1] [--port 8000] [--workers 2]
    python -m app migrate
    python -m app jobs | jobs run ID | jobs history ID
    python -m app outbox stuck [NAME] | outbox reset NAME ID
    python -m app leader

Without DATABASE_URL both start the embedded PostgreSQL (see app/embedded.py); serve
migrates it to head first. With DATABASE_URL nothing is started and serve migrates
nothing: run `python -m app migrate` for that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import NoReturn

from sqlalchemy.ext.asyncio import create_async_engine

from .admin import AdminError
from .cli_admin import COMMANDS, add_commands, int_between, main_async
from .db import DatabaseError, async_url, describe_target, migrate, verify_schema_at_head
from .embedded import default_data_dir, embedded_postgres
from .localpg import LocalPostgresError
from .redact import redact
from .settings import Settings, SettingsError, load_settings


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"regent: error: {message}; see `{self.prog} --help`\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m app", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command")
    serve = commands.add_parser("serve", help="serve the app with uvicorn (the default)")
    for target in (parser, serve):
        target.add_argument("--host", default="127.0.0.1")
        target.add_argument("--port", type=int_between(1, 65535), default=8000)
        target.add_argument("--workers", type=int_between(1, 64), default=2)
    commands.add_parser("migrate", help="upgrade the database to head")
    add_commands(commands)
    return parser


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _database_url(settings: Settings) -> Iterator[tuple[str, bool]]:
    """The URL to use, and whether it is the embedded server (started here)."""
    if settings.DATABASE_URL is not None:
        yield settings.DATABASE_URL, False
        return
    data_dir = settings.REGENT_DATA_DIR or default_data_dir()
    print(f"regent: embedded PostgreSQL, data directory {data_dir}", file=sys.stderr)
    with embedded_postgres(data_dir, settings.REGENT_PG_PORT) as server:
        print(f"regent: PostgreSQL is at {redact(server.url)}", file=sys.stderr)
        yield server.url, True


async def _check_at_head(url: str, timeout: float) -> None:
    engine = create_async_engine(async_url(url))
    try:
        await verify_schema_at_head(engine, timeout=timeout)
    finally:
        await engine.dispose()


def _serve(args: argparse.Namespace, settings: Settings) -> None:
    import uvicorn

    with _database_url(settings) as (url, embedded):
        if embedded:
            migrate(url)
        else:
            asyncio.run(_check_at_head(url, settings.DATABASE_CONNECT_TIMEOUT_SECONDS))
        os.environ["DATABASE_URL"] = url
        # Workers share metrics through this directory (prometheus multiprocess mode).
        metrics_dir = None
        if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
            metrics_dir = tempfile.mkdtemp(prefix="regent-metrics-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        print(
            f"regent: serving on http://{args.host}:{args.port} with {args.workers} worker(s)",
            file=sys.stderr,
        )
        try:
            uvicorn.run(
                "app.main:app",
                host=args.host,
                port=args.port,
                workers=args.workers,
                log_level=settings.LOG_LEVEL.lower(),
            )
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)


def _migrate(settings: Settings) -> None:
    with _database_url(settings) as (url, _):
        print(f"regent: migrating {describe_target(url)} to head", file=sys.stderr)
        migrate(url)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        settings = load_settings()
        if args.command == "migrate":
            _migrate(settings)
        elif args.command in COMMANDS:
            print(main_async(settings, args))
        else:
            _serve(args, settings)
    except AdminError as exc:
        print(f"regent: error: {exc}", file=sys.stderr)
        return 1
    except (SettingsError, DatabaseError, LocalPostgresError) as exc:
        print(f"regent: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
