"""`python -m app`: serve (the default), migrate, and the operator commands.

    python -m app [serve] [--host 127.0.0.1] [--port 8000] [--workers 2]
    python -m app migrate
    python -m app revision -m MESSAGE
    python -m app jobs | jobs run ID | jobs pause ID | jobs resume ID
    python -m app jobs history ID [--limit N] [--full]
        (each takes --schedule NAME, or --app module:attribute: see app/cli/)
    python -m app outbox list | outbox pending [NAME] | outbox stuck [NAME]
    python -m app outbox reset NAME ID
    python -m app leader [--schedule NAME]
    python -m app jobs run ID --wait [--timeout S]
    python -m app db-url | psql [PSQL-ARGS...]
    python -m app prune [--dry-run] [--schedule NAME]

The read commands take --json (for scripts), before or after the command. `jobs run
ID --wait` prints the run once it has ended and exits 1 unless it ended ok (at once,
with the request left queued, when no process leads the schedule or waits to).
`db-url` prints the database's URL, password included (the embedded server's is
readable by its owner only); `psql` opens psql on it (the password passed in the
environment, never on the command line).

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
import socket
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, NoReturn

from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine

from .app_target import DEFAULT_APP, AppTargetError, load_schedulers
from .cli.commands import COMMANDS, add_commands, database_url, main_async
from .cli.errors import RunNotOkError, UsageError
from .cli.options import add_json, int_between
from .cli.output import print_output
from .db import DatabaseError, async_url, describe_target, migrate, verify_schema_at_head
from .embedded import default_data_dir, embedded_postgres
from .invocation import program
from .localpg import LocalPostgresError, find_bindir
from .operations.errors import AdminError, UnknownJobError
from .printable import printable
from .project import project_root
from .redact import redact
from .settings import Settings, SettingsError, load_settings
from .user_migrations import UserMigrations, configured_migrations, user_migrations

if TYPE_CHECKING:
    import uvicorn


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, like every other error of the command."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"regent: error: {message}; see `{self.prog} --help`\n")


def _parser(prog: str = "python -m app") -> argparse.ArgumentParser:
    parser = _Parser(prog=prog, description=__doc__.split("\n")[0].replace("python -m app", prog))
    # Before the command too (`python -m app --json jobs`); main refuses it for a
    # command that prints no table.
    add_json(parser)
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
    commands.add_parser(
        "migrate", help="upgrade the database to head: Regent's migrations, then yours"
    )
    revision = commands.add_parser(
        "revision", help="add a revision of your own tables after the head of your migrations"
    )
    revision.add_argument("-m", "--message", required=True, help="what the revision does")
    commands.add_parser(
        "db-url", help="print the database's URL, password included (keep it to yourself)"
    )
    commands.add_parser(
        "psql", help="open psql on the database; what follows `psql` is passed on to it"
    )
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
    with embedded_postgres(
        data_dir,
        settings.REGENT_PG_PORT,
        tcp=settings.REGENT_PG_TCP,
        project=project_root(settings.REGENT_MIGRATIONS),
    ) as server:
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


async def _check_at_head(url: str, timeout: float, users: UserMigrations | None) -> None:
    engine = create_async_engine(async_url(url))
    try:
        await verify_schema_at_head(engine, timeout=timeout, users=users)
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
    # Imported here: the admin package brings FastAPI, which only serving needs; the
    # operator commands start faster without it.
    from .admin.auth import admin_key

    if admin_key(settings) is None:
        return "regent: admin page off: ADMIN_TOKEN is unset; set it to serve /admin"
    return f"regent: admin page at http://{host}:{port}/admin"


def _refuse_a_busy_port(host: str, port: int) -> None:
    """Raise UsageError naming the port and --port when nothing may listen there now:
    uvicorn's own "address already in use" names neither, and comes after the embedded
    server's start and a migration."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As uvicorn binds: a port left in TIME_WAIT is free to it.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise UsageError(
                f"cannot listen on {host}:{port} ({exc.strerror}); stop what listens there, "
                "or serve on another port with --port"
            ) from None


def _serve(args: argparse.Namespace, settings: Settings) -> None:
    import uvicorn

    _refuse_a_busy_port(args.host, args.port)
    target = _app_target(args, settings)
    if target == DEFAULT_APP:
        # Checked here too: each worker would otherwise fail alone, after a migration.
        from .jobs import JobDeps, refuse_logging_gateways, require_the_demos_tables

        require_the_demos_tables()
        refuse_logging_gateways(settings, JobDeps())

    users = configured_migrations(settings)
    with _database_url(settings) as (url, embedded):
        if embedded:
            migrate(url, users)
        else:
            asyncio.run(_check_at_head(url, settings.DATABASE_CONNECT_TIMEOUT_SECONDS, users))
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
        config = uvicorn.Config(
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
        try:
            _run_server(config)
        finally:
            if metrics_dir is not None:
                shutil.rmtree(metrics_dir, ignore_errors=True)


def _run_server(config: uvicorn.Config) -> None:
    """Serve ``config`` (a uvicorn.Config) until stopped. Raises SystemExit with uvicorn's
    start-up failure status (3) when the server's workers failed to start: uvicorn does
    so for one worker, and its supervisor of several stops then but returns as from a
    clean stop, which a process supervisor (systemd, a container runtime) would take for
    one."""
    import uvicorn
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    if config.workers == 1:
        server = uvicorn.Server(config)
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        failed = not server.started
    else:
        supervisor = Multiprocess(config, sockets=[config.bind_socket()])
        with contextlib.suppress(KeyboardInterrupt):
            supervisor.run()
        failed = any(worker.exitcode == STARTUP_FAILURE for worker in supervisor.processes)
    if failed:
        raise SystemExit(STARTUP_FAILURE)


def _migrate(settings: Settings) -> None:
    users = configured_migrations(settings)
    with _database_url(settings) as (url, _):
        print(f"regent: migrating {describe_target(url)} to head", file=sys.stderr)
        migrate(url, users)
        if users is None or not users.exists:
            where = "REGENT_MIGRATIONS is empty" if users is None else f"none in {users.directory}"
            print(f"regent: no migrations of your own ({where})", file=sys.stderr)
        else:
            heads = ", ".join(sorted(users.heads())) or "<empty>"
            print(f"regent: your migrations in {users.directory} at head {heads}", file=sys.stderr)


def _revision(settings: Settings, message: str) -> None:
    users = user_migrations(settings.REGENT_MIGRATIONS)
    if users is None:
        raise UsageError("REGENT_MIGRATIONS is empty: set it to your migrations' directory")
    if not users.exists:
        print(f"regent: starting your migrations in {users.directory}", file=sys.stderr)
    path = users.revision(message)
    print(f"regent: wrote {path}; fill in upgrade(), then `{program()} migrate`", file=sys.stderr)


def _parse(argv: list[str], prog: str) -> argparse.Namespace:
    """The command line's arguments; what follows ``psql`` is psql's own (``psql -At``:
    argparse would take ``-At`` for an option of ours)."""
    parser = _parser(prog)
    if "psql" in argv:
        at = argv.index("psql")
        args = parser.parse_args(argv[: at + 1])
        if args.command == "psql":
            args.psql_args = argv[at + 1 :]
            return args
    return parser.parse_args(argv)


def _psql(settings: Settings, psql_args: Sequence[str]) -> NoReturn:
    """Replace this process with psql on the database; the password goes in PGPASSWORD,
    not on a command line other users can read. Raises UsageError when no psql is found."""
    url = make_url(database_url(settings))
    psql = shutil.which("psql")
    with contextlib.suppress(LocalPostgresError):
        # The embedded server's binaries come with their psql.
        psql = psql or shutil.which("psql", path=str(find_bindir()))
    if psql is None:
        raise UsageError(
            "no psql found on PATH; install the PostgreSQL client (e.g. apt install "
            f"postgresql-client), or give another client `{program()} db-url`"
        )
    environment = dict(os.environ)
    if url.password is not None:
        environment["PGPASSWORD"] = str(url.password)
    target = URL.create(
        "postgresql", url.username, None, url.host, url.port, url.database, url.query
    ).render_as_string(hide_password=False)
    os.execve(psql, [psql, target, *psql_args], environment)


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Run the command line (``prog``: how its help and usage errors name it, by
    default the command this process was started by); returns the process exit code."""
    args = _parse(list(sys.argv[1:] if argv is None else argv), prog or program())
    signal.signal(signal.SIGTERM, _terminate)
    try:
        if getattr(args, "json", False) and args.command not in COMMANDS:
            raise UsageError(
                f"--json is for the read commands ({', '.join(COMMANDS)}); "
                f"`{args.command or 'serve'}` prints no table"
            )
        settings = load_settings()
        if args.command == "migrate":
            _migrate(settings)
        elif args.command == "revision":
            _revision(settings, args.message)
        elif args.command == "db-url":
            return print_output(database_url(settings))
        elif args.command == "psql":
            _psql(settings, args.psql_args)
        elif args.command in COMMANDS:
            return print_output(main_async(settings, args))
        else:
            _serve(args, settings)
    except RunNotOkError as exc:
        print_output(str(exc))
        return 1
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
