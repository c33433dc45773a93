"""`python -m app`: serve (the default), migrate, and the operator commands.

    python -m app [serve] [--host 127.0.0.1] [--port 8000] [--workers 2]
    python -m app migrate
    python -m app jobs | jobs run ID | jobs pause ID | jobs resume ID
    python -m app jobs history ID [--limit N] [--full]
        (each takes --schedule NAME, or --app module:attribute: see app/cli_admin.py)
    python -m app outbox list | outbox pending [NAME] | outbox stuck [NAME]
    python -m app outbox reset NAME ID
    python -m app leader [--schedule NAME]
    python -m app prune [--dry-run] [--schedule NAME]

The read commands take --json (for scripts).

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
from pathlib import Path
from types import FrameType
from typing import NoReturn

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from .admin import AdminError, UnknownJobError
from .admin.auth import admin_key
from .app_target import DEFAULT_APP, AppTargetError, load_schedulers
from .cli_admin import COMMANDS, UsageError, add_commands, int_between, main_async
from .db import DatabaseError, async_url, describe_target, migrate, verify_schema_at_head
from .embedded import default_data_dir, embedded_postgres
from .localpg import LocalPostgresError
from .printable import printable
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
        # Defaults live on the top-level parser only: a subparser's default would
        # overwrite an option given before `serve` (`python -m app --app X serve`).
        def default(value: object, target: argparse.ArgumentParser = target) -> object:
            return value if target is parser else argparse.SUPPRESS

        target.add_argument("--host", default=default("127.0.0.1"))
        target.add_argument("--port", type=int_between(1, 65535), default=default(8000))
        target.add_argument("--workers", type=int_between(1, 64), default=default(2))
        target.add_argument(
            "--app",
            default=default(None),
            help="module:attribute of an ASGI app built with create_app(...) "
            "(default: REGENT_APP, else app.main:app)",
        )
    commands.add_parser("migrate", help="upgrade the database to head")
    add_commands(commands)
    return parser


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _database_url(settings: Settings) -> Iterator[tuple[str, bool]]:
    """The URL to use, and whether it is the embedded server (started here)."""
    if settings.database_url is not None:
        yield settings.database_url, False
        return
    data_dir = settings.REGENT_DATA_DIR or default_data_dir()
    print(f"regent: embedded PostgreSQL, data directory {data_dir}", file=sys.stderr)
    with embedded_postgres(data_dir, settings.REGENT_PG_PORT, tcp=settings.REGENT_PG_TCP) as server:
        print(f"regent: PostgreSQL is at {redact(server.url)}", file=sys.stderr)
        if server.tcp:
            tcp_url = server.tcp_url_for(server.database).replace(
                f":{make_url(server.url).password}@", ":<password>@"
            )
            print(
                f"regent: PostgreSQL also listens on 127.0.0.1:{server.port} (REGENT_PG_TCP) "
                f"for other tools: {tcp_url}, the password in {server.password_path}",
                file=sys.stderr,
            )
        yield server.url, True


async def _check_at_head(url: str, timeout: float) -> None:
    engine = create_async_engine(async_url(url))
    try:
        await verify_schema_at_head(engine, timeout=timeout)
    finally:
        await engine.dispose()


_METRICS_PREFIX = "regent-metrics-"


def _remove_orphaned_metrics_dirs() -> None:
    """Remove the metrics directories of earlier runs whose process is gone (kill -9
    skips the clean-up in ``_serve``). Only where /proc tells which processes live."""
    if not Path("/proc/self").exists():
        return
    for path in Path(tempfile.gettempdir()).glob(f"{_METRICS_PREFIX}*-*"):
        owner = path.name.removeprefix(_METRICS_PREFIX).split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            shutil.rmtree(path, ignore_errors=True)


def _app_target(args: argparse.Namespace, settings: Settings) -> str:
    """The app to serve, checked by importing it here so a typo fails in one line."""
    target: str = args.app or settings.REGENT_APP
    if target != DEFAULT_APP:
        package = target.partition(":")[0].partition(".")[0]
        imported_before = set(sys.modules)
        load_schedulers(target, "--app" if args.app else "REGENT_APP")
        # The check imported the user's package before DATABASE_URL is set; a worker
        # must import it afresh (uvicorn reuses a cached module with one worker).
        for name in set(sys.modules) - imported_before:
            if name == package or name.startswith(f"{package}."):
                del sys.modules[name]
    return target


def admin_page_note(settings: Settings, host: str, port: int) -> str:
    """The start-up line that says where the admin page is, or that it is off and why."""
    if admin_key(settings) is None:
        return "regent: admin page off: ADMIN_TOKEN is unset; set it to serve /admin"
    return f"regent: admin page at http://{host}:{port}/admin"


def _serve(args: argparse.Namespace, settings: Settings) -> None:
    import uvicorn

    target = _app_target(args, settings)
    if target == DEFAULT_APP:
        # Checked here too: each worker would otherwise fail alone, after a migration.
        from .jobs import JobDeps, refuse_logging_gateways

        refuse_logging_gateways(settings, JobDeps())

    with _database_url(settings) as (url, embedded):
        if embedded:
            migrate(url)
        else:
            asyncio.run(_check_at_head(url, settings.DATABASE_CONNECT_TIMEOUT_SECONDS))
        os.environ["DATABASE_URL"] = url
        # Workers share metrics through this directory (prometheus multiprocess mode).
        metrics_dir = None
        if "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
            _remove_orphaned_metrics_dirs()
            metrics_dir = tempfile.mkdtemp(prefix=f"{_METRICS_PREFIX}{os.getpid()}-")
            os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        print(
            f"regent: serving {target} on http://{args.host}:{args.port} "
            f"with {args.workers} worker(s)",
            file=sys.stderr,
        )
        print(admin_page_note(settings, args.host, args.port), file=sys.stderr)
        try:
            uvicorn.run(
                target,
                host=args.host,
                port=args.port,
                workers=args.workers,
                log_level=settings.LOG_LEVEL.lower(),
                # X-Forwarded-For only from TRUSTED_PROXIES: uvicorn's own default
                # believes any client on 127.0.0.1, so a local user could name any address.
                proxy_headers=bool(settings.trusted_proxies),
                forwarded_allow_ips=settings.trusted_proxies or None,
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
    except UnknownJobError as exc:
        # Most often the wrong schedule (its name is in the message): a usage error.
        print(f"regent: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except AdminError as exc:
        print(f"regent: error: {printable(str(exc))}", file=sys.stderr)
        return 1
    except (SettingsError, DatabaseError, LocalPostgresError, AppTargetError, UsageError) as exc:
        print(f"regent: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
