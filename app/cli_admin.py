"""The operator commands of `python -m app`: jobs, outbox, leader, prune.

The jobs, leader and prune commands work on one schedule (app/scheduler/keys.py) and touch no
other schedule's rows: the one ``--schedule`` names; else the one the app runs, the
app being ``--app`` or REGENT_APP (the same one `python -m app` serves, found inside
ASGI middleware too: app/app_target.py): the name its Scheduler is given in code
(``Scheduler(name=...)``), else the SCHEDULER_NAME of the Settings it was built with
(``create_app(Settings(SCHEDULER_NAME=...))``); else SCHEDULER_NAME (``default`` unless
set). Every confirmation names the schedule.

They talk to the database (DATABASE_URL, or the embedded server of a running
`python -m app`) through the same queries as the admin API, and print plain tables that
read like the admin page (see app/admin/display.py): one line per row, timestamps in UTC
to the second, yes/no, durations with their unit. Every value from data is printed
through app/printable.py, so a control character in a key or an error is shown as an
escape, never sent to the terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine

from .admin import display, leadership, outboxes
from .admin.jobs import forget_job, list_jobs, run_job_now, set_paused
from .admin.messages import outbox_messages, reset_outbox_message
from .admin.run_status import RUN_STATUSES
from .admin.runs import job_runs, manual_run
from .app_target import DEFAULT_APP, load_scheduler
from .db import DatabaseUnreachableError, async_url, verify_schema_at_head
from .embedded import default_data_dir, embedded_url, socket_path
from .printable import printable
from .retention import RetentionPolicy, prunable, prune
from .scheduler import Clock, InvalidScheduleNameError, SystemClock
from .scheduler.clock import lease_now
from .scheduler.keys import validate_schedule_name
from .settings import Settings

__all__ = [
    "RunNotOkError",
    "UsageError",
    "add_commands",
    "int_between",
    "run_command",
    "schedule_of",
]


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


def _schedule_name(text: str) -> str:
    """An argparse ``type``: a valid schedule name, else an error saying the rule."""
    try:
        return validate_schedule_name(text)
    except InvalidScheduleNameError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


_schedule_name.__name__ = "schedule name"


def _add_schedule_options(parser: argparse.ArgumentParser, *, inner: bool) -> None:
    """--schedule and --app on a command. An ``inner`` (sub-)command leaves them unset
    when not given, so the ones given before it (``jobs --schedule X pause ID``) hold."""
    unset = argparse.SUPPRESS if inner else None
    parser.add_argument(
        "--schedule",
        type=_schedule_name,
        default=unset,
        help="the schedule to work on (default: the name of the app's Scheduler, else "
        "SCHEDULER_NAME)",
    )
    parser.add_argument(
        "--app",
        default=argparse.SUPPRESS,
        help="module:attribute of the app whose schedule to work on (default: REGENT_APP)",
    )


def _add_json(parser: argparse.ArgumentParser, *, inner: bool) -> None:
    """--json on a command; an ``inner`` (sub-)command leaves it as given before it
    (``jobs --json history ID`` prints JSON as ``jobs history ID --json`` does)."""
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if inner else False,
        help="print JSON instead of a table",
    )


def add_commands(commands: Any) -> None:
    """Add the jobs, outbox, leader and prune sub-commands to an argparse sub-parser set.

    Every read command takes ``--json`` (rows as JSON, timestamps ISO-8601) for scripts,
    before or after its sub-command.
    """
    jobs = commands.add_parser(
        "jobs", help="list the jobs; run, pause or resume one; show its history"
    )
    _add_json(jobs, inner=False)
    jobs.add_argument(
        "--all", action="store_true", help="list retired jobs too (no longer registered)"
    )
    _add_schedule_options(jobs, inner=False)
    job_commands = jobs.add_subparsers(
        dest="jobs_command", metavar="{run,pause,resume,history,forget}"
    )
    run = job_commands.add_parser("run", help="fire a job now (through the slot claim)")
    pause = job_commands.add_parser("pause", help="claim no slot of the job until resumed")
    resume = job_commands.add_parser("resume", help="resume a paused job")
    history = job_commands.add_parser("history", help="a job's run history, newest first")
    forget = job_commands.add_parser(
        "forget", help="delete a retired job's row and history (refused for a live job)"
    )
    for command in (run, pause, resume, history, forget):
        command.add_argument("job_id")
        _add_schedule_options(command, inner=True)
    run.add_argument(
        "--wait",
        action="store_true",
        help="wait for the run to end, print it, and exit non-zero unless it ended ok",
    )
    run.add_argument(
        "--timeout",
        type=int_between(1, 86400),
        default=600,
        help="seconds --wait waits for the run to end (default 600)",
    )
    _add_json(run, inner=True)
    history.add_argument("--limit", type=int_between(1, 500), default=20)
    history.add_argument("--full", action="store_true", help="print each error whole")
    history.add_argument(
        "--status",
        choices=RUN_STATUSES,
        metavar="STATUS",
        help=f"only the runs of this status, one of {', '.join(RUN_STATUSES)}",
    )
    _add_json(history, inner=True)
    outbox = commands.add_parser(
        "outbox", help="outboxes and their rows: list, pending, scheduled, stuck, reset"
    )
    _add_json(outbox, inner=False)
    outbox_commands = outbox.add_subparsers(dest="outbox_command", metavar=OUTBOX_COMMANDS)
    listing = outbox_commands.add_parser("list", help="each outbox with its counts per status")
    listing.add_argument(
        "--all", action="store_true", help="list retired outboxes too (no app drains them)"
    )
    pending = outbox_commands.add_parser("pending", help="list pending rows and their last error")
    pending.add_argument("name", nargs="?")
    scheduled = outbox_commands.add_parser(
        "scheduled", help="list delayed rows not yet due, soonest first"
    )
    scheduled.add_argument("name", nargs="?")
    stuck = outbox_commands.add_parser("stuck", help="list stuck rows")
    stuck.add_argument("name", nargs="?")
    for reader in (listing, pending, scheduled, stuck):
        _add_json(reader, inner=True)
    forget_outbox = outbox_commands.add_parser(
        "forget", help="delete a retired outbox's rows (refused while an app drains it)"
    )
    forget_outbox.add_argument("name")
    reset = outbox_commands.add_parser(
        "reset", help="make a stuck row (or with --all-stuck every one) pending and due now"
    )
    reset.add_argument("name")
    # Any whole number: one past the column type is a "no such message", not a crash.
    reset.add_argument("message_id", type=int, nargs="?")
    reset.add_argument(
        "--all-stuck",
        action="store_true",
        help="reset every stuck row of the outbox in one statement (rows another "
        "transaction holds are left alone and counted)",
    )
    leader = commands.add_parser("leader", help="show the leader and the standbys waiting")
    _add_json(leader, inner=False)
    _add_schedule_options(leader, inner=False)
    prune = commands.add_parser(
        "prune",
        help="delete the history retention no longer keeps, now (RUN_HISTORY_DAYS, "
        "RUN_HISTORY_KEEP, OUTBOX_DELIVERED_DAYS), as the regent_retention job does",
    )
    prune.add_argument(
        "--dry-run", action="store_true", help="print what would be deleted; delete nothing"
    )
    prune.add_argument("--json", action="store_true", help="print JSON instead of lines")
    _add_schedule_options(prune, inner=False)


OUTBOX_COMMANDS = "{list,pending,scheduled,stuck,reset,forget}"


class UsageError(Exception):
    """A command was given without the sub-command it needs; the message is its usage."""


class RunNotOkError(Exception):
    """`jobs run --wait`: the run ended other than ok, or did not end in time. The
    message is what to print (the run, as the command prints it)."""


# How often `jobs run --wait` reads whether the run has ended.
_RUN_POLL_SECONDS = 0.5


def _cell(value: Any) -> str:
    if isinstance(value, datetime):
        return display.timestamp(value)
    if isinstance(value, bool):
        return display.yes_no(value)
    if isinstance(value, dict | list):
        return printable(json.dumps(value, default=str)[:60])
    if isinstance(value, str):
        # A table row is one line: a multi-line text shows the line that says most.
        summary = display.error_summary(value) if "\n" in value or "\r" in value else value
        return printable(summary)
    return "" if value is None else printable(str(value))


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """Rows as aligned columns, one line each."""
    cells = [[_cell(row.get(column)) for column in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def _json(value: Any) -> str:
    def encode(item: Any) -> Any:
        if isinstance(item, datetime):
            return item.isoformat()
        return str(item)

    # ASCII JSON escapes every control character but DEL; that one is escaped here.
    return json.dumps(value, default=encode, indent=2).replace("\x7f", "\\u007f")


def _history(runs: Sequence[dict[str, Any]], full: bool) -> str:
    rows = [
        run
        | {
            "error": display.error_summary(run["error"]),
            "lateness": display.milliseconds(run["lateness_ms"]),
            "duration": display.milliseconds(run["duration_ms"]),
        }
        for run in runs
    ]
    columns = ["id", "slot", "status", "manual", "lateness", "duration", "pid", "host", "error"]
    table = _table(rows, columns)
    if not full:
        return table
    errors = [f"run {run['id']}:\n{_block(run['error'])}" for run in runs if run["error"]]
    return "\n\n".join([table, *errors])


def _block(text: str) -> str:
    """A stored text whole, each of its lines escaped and indented: its line breaks
    are kept, and no line of it starts where the command's own lines do."""
    return "\n".join(f"    {printable(line)}" for line in text.rstrip().split("\n"))


def schedule_of(args: argparse.Namespace, settings: Settings) -> str:
    """The schedule a jobs or leader command works on: ``--schedule``; else the one
    the app (``--app``, else REGENT_APP) runs: its Scheduler's name given in code, else
    the SCHEDULER_NAME of the Settings the app was built with; else SCHEDULER_NAME.
    Raises AppTargetError when the app cannot be imported or has no Regent scheduler
    that can be found."""
    if args.schedule is not None:
        name: str = args.schedule
        return name
    app: str | None = getattr(args, "app", None)
    target = app or settings.REGENT_APP
    if target == DEFAULT_APP:
        # The shipped app's Scheduler takes its name from SCHEDULER_NAME.
        return settings.SCHEDULER_NAME
    found = load_scheduler(target, "--app" if app else "REGENT_APP")
    return found.schedule(settings.SCHEDULER_NAME)


async def _jobs(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    schedule = schedule_of(args, settings)
    if args.jobs_command == "run":
        requested = await run_job_now(
            engine, args.job_id, lease_now=lease_now(clock), schedule=schedule
        )
        if args.wait:
            return await _wait_for_run(engine, args, schedule, requested, clock)
        return (
            f"queued {printable(args.job_id)} (schedule {schedule}): the leader fires it now, "
            "through its slot claim"
        )
    if args.jobs_command in ("pause", "resume"):
        paused = args.jobs_command == "pause"
        await set_paused(engine, args.job_id, paused, schedule=schedule)
        return f"{'paused' if paused else 'resumed'} {printable(args.job_id)} (schedule {schedule})"
    if args.jobs_command == "forget":
        deleted = await forget_job(engine, args.job_id, schedule=schedule)
        return f"forgot {printable(args.job_id)} (schedule {schedule}) and its {deleted} run(s)"
    if args.jobs_command == "history":
        runs = await job_runs(
            engine, args.job_id, limit=args.limit, schedule=schedule, status=args.status
        )
        return _json(runs) if args.json else _history(runs, args.full)
    jobs = await list_jobs(engine, lease_now(clock), schedule=schedule, retired=args.all)
    if args.json:
        return _json(jobs)
    rows = [
        job
        | {
            "next_run_at": "retired"
            if job["retired_at"]
            else "paused"
            if job["paused"]
            else job["next_run_at"],
            "trigger": display.trigger(job["trigger"], settings.TIMEZONE),
            "waiting": display.unclaimed(job["unclaimed_seconds"], job["held_by"]),
        }
        for job in jobs
    ]
    columns = [
        "id",
        "name",
        "trigger",
        "next_run_at",
        "waiting",
        "last_status",
        "running",
        "last_finished_at",
        "paused",
    ]
    return f"schedule {schedule}\n{_table(rows, columns)}"


async def _wait_for_run(
    engine: AsyncEngine,
    args: argparse.Namespace,
    schedule: str,
    requested: datetime,
    clock: Clock,
) -> str:
    """The manual run asked for at ``requested``, once it has ended, as the command
    prints it; RunNotOkError carrying that when it ended other than ok or is still to
    end after --timeout seconds."""
    deadline = clock.monotonic() + args.timeout
    while True:
        run = await manual_run(engine, args.job_id, requested, schedule=schedule)
        if run is not None and run["status"] != "running":
            shown = _json(run) if args.json else _history([run], full=True)
            if run["status"] != "ok":
                raise RunNotOkError(shown)
            return shown
        if clock.monotonic() >= deadline:
            state = "has not started" if run is None else "is still running"
            raise RunNotOkError(
                f"the run of {printable(args.job_id)} asked for at {requested.isoformat()} "
                f"{state} after {args.timeout} s (--timeout); see `jobs history "
                f"{printable(args.job_id)}` (is a leader of schedule {schedule} running?)"
            )
        await clock.sleep(_RUN_POLL_SECONDS)


async def _outbox(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    if args.outbox_command == "reset" and args.all_stuck:
        done = await outboxes.reset_all_stuck(engine, args.name, lease_now(clock))
        told = (
            f"{done['reset']} stuck message(s) of outbox '{printable(args.name)}' are "
            "pending again, due now"
        )
        if done["held"]:
            told += (
                f"; {done['held']} held by another transaction were left stuck (run it "
                "again once that transaction has ended)"
            )
        return told
    if args.outbox_command == "reset":
        await reset_outbox_message(engine, args.name, args.message_id, lease_now(clock))
        name = printable(args.name)
        return f"outbox '{name}' message {args.message_id} is pending again, due now"
    if args.outbox_command == "forget":
        deleted = await outboxes.forget_outbox(engine, args.name)
        return f"forgot outbox '{printable(args.name)}' and its {deleted} message(s)"
    if args.outbox_command == "list":
        summary = await outboxes.list_outboxes(engine, lease_now(clock), retired=args.all)
        if args.json:
            return _json(summary)
        if not summary:
            return "no outboxes"
        rows = [
            {
                "pending": entry["counts"]["pending"],
                "scheduled": entry["counts"]["scheduled"],
                "stuck": entry["counts"]["stuck"],
            }
            | {
                "delivered_1h": entry["counts"]["delivered"],
                "outbox": entry["name"],
                "oldest_pending_s": ""
                if entry["oldest_pending_seconds"] is None
                else f"{entry['oldest_pending_seconds']:.1f}",
                "last_drain_at": entry["last_drain_at"] or "never",
                "drained": "retired" if entry["retired"] else "yes",
            }
            for entry in summary
        ]
        # Delivered: the last hour's (outboxes.DELIVERED_WINDOW_SECONDS), not every row kept.
        columns = [
            "outbox",
            "pending",
            "scheduled",
            "delivered_1h",
            "stuck",
            "oldest_pending_s",
            "last_drain_at",
            "drained",
        ]
        return _table(rows, columns)
    status = args.outbox_command
    rows = await outbox_messages(engine, args.name, status=status, lease_now=lease_now(clock))
    if args.json:
        return _json(rows)
    if not rows:
        return f"no {status} rows"
    if status == "scheduled":
        return _table(rows, ["id", "outbox", "key", "deliver_at", "created_at"])
    when = "next_attempt_at" if status == "pending" else "updated_at"
    return _table(rows, ["id", "outbox", "key", "attempts", when, "last_error"])


async def _leader(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    info = await leadership.leader(
        engine, lease_now=lease_now(clock), schedule=schedule_of(args, settings)
    )
    if args.json:
        return _json(info)
    waiting = display.standbys(info["standbys_on_key"], info["standbys_behind_host_lock"])
    if info["backend_pid"] is None:
        return f"no leader of schedule {info['schedule']}; {waiting}"
    columns = ["schedule", "pid", "host", "application_name", "since"]
    return f"{_table([info], columns)}\n{waiting}"


async def _prune(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    schedule = schedule_of(args, settings)
    policy = RetentionPolicy.of(settings)
    async with AsyncSession(engine) as session:
        if args.dry_run:
            report = await prunable(session, schedule, policy, lease_now(clock))
        else:
            report = await prune(session, schedule, policy, lease_now(clock))
    if args.json:
        return _json(
            {
                "schedule": schedule,
                "dry_run": args.dry_run,
                "runs": report.runs,
                "delivered": report.delivered,
            }
        )
    verb = "would delete" if args.dry_run else "deleted"
    lines = [
        f"schedule {schedule}: {verb} {report.runs} run(s) started more than "
        f"{policy.run_history_days} days ago (RUN_HISTORY_DAYS), beyond the last "
        f"{policy.run_history_keep} of each job (RUN_HISTORY_KEEP)"
    ]
    lines += [
        f"outbox '{printable(name)}': {verb} {count} row(s) delivered more than "
        f"{policy.outbox_delivered_days} days ago (OUTBOX_DELIVERED_DAYS)"
        for name, count in report.delivered.items()
    ]
    return "\n".join(lines)


COMMANDS: dict[
    str, Callable[[AsyncEngine, argparse.Namespace, Settings, Clock], Awaitable[str]]
] = {
    "jobs": _jobs,
    "outbox": _outbox,
    "leader": _leader,
    "prune": _prune,
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
    resetting = args.command == "outbox" and args.outbox_command == "reset"
    if resetting and (args.message_id is None) == (not args.all_stuck):
        raise UsageError(
            "`python -m app outbox reset NAME` takes a message ID or --all-stuck "
            "(one of them, not both)"
        )
    if args.command == "outbox" and args.outbox_command is None:
        raise UsageError(
            f"`python -m app outbox` needs a sub-command, one of {OUTBOX_COMMANDS}: list "
            "(counts per status), pending [NAME], scheduled [NAME], stuck [NAME], reset NAME "
            "(ID | --all-stuck), forget NAME"
        )
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
                f"REGENT_PG_PORT): {exc}. Start `python -m app` first, set REGENT_PG_PORT "
                "to the port it was started with, or set DATABASE_URL"
            ) from None
        return await COMMANDS[args.command](engine, args, settings, clock)
    finally:
        await engine.dispose()


def main_async(settings: Settings, args: argparse.Namespace) -> str:
    """Synchronous entry for __main__."""
    return asyncio.run(run_command(settings, args))
