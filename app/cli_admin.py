"""The operator commands of `python -m app`: jobs, outbox, leader.

They talk to the database (DATABASE_URL, or the embedded server of a running
`python -m app`) through the same queries as the admin API, and print plain tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .admin import queries
from .db import async_url, verify_schema_at_head
from .scheduler import SystemClock
from .settings import Settings

__all__ = ["add_commands", "int_between", "run_command"]


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse ``type``: an int from ``low`` to ``high``, else an error saying so."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not between {low} and {high}")
        return value

    parse.__name__ = "int"
    return parse


def add_commands(commands: Any) -> None:
    """Add the jobs, outbox and leader sub-commands to an argparse sub-parser set."""
    jobs = commands.add_parser("jobs", help="list the jobs; run one now; show its history")
    job_commands = jobs.add_subparsers(dest="jobs_command")
    run = job_commands.add_parser("run", help="fire a job now (through the slot claim)")
    run.add_argument("job_id")
    history = job_commands.add_parser("history", help="a job's run history, newest first")
    history.add_argument("job_id")
    history.add_argument("--limit", type=int_between(1, 500), default=20)
    outbox = commands.add_parser("outbox", help="stuck outbox rows: list, reset")
    outbox_commands = outbox.add_subparsers(dest="outbox_command", required=True)
    stuck = outbox_commands.add_parser("stuck", help="list stuck rows")
    stuck.add_argument("name", nargs="?")
    reset = outbox_commands.add_parser("reset", help="make a stuck row pending and due now")
    reset.add_argument("name")
    # Any whole number: one past the column type is a "no such message", not a crash.
    reset.add_argument("message_id", type=int)
    commands.add_parser("leader", help="show the leader and the standbys waiting")


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    def cell(value: Any) -> str:
        if isinstance(value, datetime):
            return value.isoformat(timespec="seconds")
        if isinstance(value, dict | list):
            return json.dumps(value, default=str)[:60]
        return "" if value is None else str(value)

    cells = [[cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


async def _jobs(engine: AsyncEngine, args: argparse.Namespace) -> str:
    now = SystemClock().now()
    if args.jobs_command == "run":
        await queries.run_job_now(engine, args.job_id, now)
        return f"job {args.job_id!r} queued: the leader fires it now, through its slot claim"
    if args.jobs_command == "history":
        runs = await queries.job_runs(engine, args.job_id, limit=args.limit)
        return _table(runs, ["id", "slot", "status", "duration_ms", "lateness_ms", "pid", "error"])
    jobs = await queries.list_jobs(engine, now)
    columns = ["id", "name", "trigger", "next_run_at", "last_status", "last_finished_at", "paused"]
    return _table(jobs, columns)


async def _outbox(engine: AsyncEngine, args: argparse.Namespace) -> str:
    if args.outbox_command == "reset":
        await queries.reset_outbox_message(engine, args.name, args.message_id, SystemClock().now())
        return f"outbox {args.name!r} message {args.message_id} is pending again, due now"
    rows = await queries.stuck_messages(engine, args.name)
    if not rows:
        return "no stuck rows"
    return _table(rows, ["id", "outbox", "key", "attempts", "last_error", "updated_at"])


async def _leader(engine: AsyncEngine, args: argparse.Namespace) -> str:
    info = await queries.leader(engine)
    if info["backend_pid"] is None:
        return f"no leader; {info['standbys']} standby(s) waiting"
    return _table([info], ["pid", "host", "application_name", "since", "standbys"])


COMMANDS: dict[str, Callable[[AsyncEngine, argparse.Namespace], Awaitable[str]]] = {
    "jobs": _jobs,
    "outbox": _outbox,
    "leader": _leader,
}


def database_url(settings: Settings) -> str:
    """DATABASE_URL, or the embedded server a running `python -m app` listens on."""
    return settings.DATABASE_URL or (
        f"postgresql://regent@127.0.0.1:{settings.REGENT_PG_PORT}/regent"
    )


async def run_command(settings: Settings, args: argparse.Namespace) -> str:
    """Run an operator command; returns what to print. Raises AdminError or
    DatabaseError with a message that says what was wrong."""
    url = database_url(settings)
    engine = create_async_engine(async_url(url))
    try:
        await verify_schema_at_head(engine, timeout=settings.DATABASE_CONNECT_TIMEOUT_SECONDS)
        return await COMMANDS[args.command](engine, args)
    finally:
        await engine.dispose()


def main_async(settings: Settings, args: argparse.Namespace) -> str:
    """Synchronous entry for __main__."""
    return asyncio.run(run_command(settings, args))
