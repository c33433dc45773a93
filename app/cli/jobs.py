"""`python -m app jobs`: list a schedule's jobs; run one now (and wait for its run),
pause, resume or forget one; show a job's run history."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from ..invocation import program
from ..operations import display, leadership
from ..operations.jobs import forget_job, list_jobs, run_job_now, set_paused
from ..operations.run_status import RUN_STATUSES
from ..operations.runs import job_runs, manual_run
from ..printable import printable
from ..scheduler import Clock
from ..scheduler.clock import lease_now
from ..settings import Settings
from .errors import RunNotOkError
from .options import add_json, add_schedule_options, int_between, schedule_of
from .output import block, table, to_json

__all__ = ["add_parser", "execute"]


def _no_leader(schedule: str) -> str:
    """What `jobs run` says (and `run --wait` raises) while nothing would run a request."""
    return (
        f"no process leads schedule {schedule} or waits to (no app of it runs): the request "
        f"stays queued for the leader of an app that starts (`{program()} leader` shows it)"
    )


# How often `jobs run --wait` reads whether the run has ended.
_RUN_POLL_SECONDS = 0.5


def add_parser(commands: Any) -> None:
    """Add ``jobs`` and its sub-commands (run, pause, resume, history, forget) to an
    argparse sub-parser set."""
    jobs = commands.add_parser(
        "jobs", help="list the jobs; run, pause or resume one; show its history"
    )
    add_json(jobs)
    jobs.add_argument(
        "--all", action="store_true", help="list retired jobs too (no longer registered)"
    )
    add_schedule_options(jobs, inner=False)
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
        add_schedule_options(command, inner=True)
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
    for writer in (run, pause, resume, forget):
        add_json(writer)
    history.add_argument("--limit", type=int_between(1, 500), default=20)
    history.add_argument("--full", action="store_true", help="print each error whole")
    history.add_argument(
        "--status",
        choices=RUN_STATUSES,
        metavar="STATUS",
        help=f"only the runs of this status, one of {', '.join(RUN_STATUSES)}",
    )
    add_json(history)


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
    shown = table(rows, columns)
    if not full:
        return shown
    errors = [f"run {run['id']}:\n{block(run['error'])}" for run in runs if run["error"]]
    return "\n\n".join([shown, *errors])


async def execute(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    """Run a ``jobs`` command on the schedule it works on; returns what to print. Raises
    AdminError as the admin queries do (UnknownJobError for a job the schedule does not
    have, Conflict for a state that forbids it) and RunNotOkError for ``run --wait``."""
    schedule = schedule_of(args, settings)
    if args.jobs_command == "run":
        requested = await run_job_now(
            engine, args.job_id, lease_now=lease_now(clock), schedule=schedule
        )
        if args.wait:
            return await _wait_for_run(engine, args, schedule, requested, clock)
        led = await _led(engine, schedule, clock)
        if args.json:
            return to_json(_done("queued", args.job_id, schedule) | {"led": led})
        queued = f"queued {printable(args.job_id)} (schedule {schedule})"
        if not led:
            return f"{queued}; {_no_leader(schedule)}"
        return f"{queued}: the leader fires it now, through its slot claim"
    if args.jobs_command in ("pause", "resume"):
        paused = args.jobs_command == "pause"
        await set_paused(engine, args.job_id, paused, schedule=schedule)
        status = "paused" if paused else "resumed"
        if args.json:
            return to_json(_done(status, args.job_id, schedule))
        return f"{status} {printable(args.job_id)} (schedule {schedule})"
    if args.jobs_command == "forget":
        deleted = await forget_job(engine, args.job_id, schedule=schedule)
        if args.json:
            return to_json(_done("forgotten", args.job_id, schedule) | {"runs_deleted": deleted})
        return f"forgot {printable(args.job_id)} (schedule {schedule}) and its {deleted} run(s)"
    if args.jobs_command == "history":
        runs = await job_runs(
            engine, args.job_id, limit=args.limit, schedule=schedule, status=args.status
        )
        return to_json(runs) if args.json else _history(runs, args.full)
    jobs = await list_jobs(engine, lease_now(clock), schedule=schedule, retired=args.all)
    if args.json:
        return to_json(jobs)
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
    return f"schedule {schedule}\n{table(rows, columns)}"


def _done(status: str, job_id: str, schedule: str) -> dict[str, str]:
    """What a write command prints with --json: the admin API's answer to the same
    action (``status``), and what it was done to."""
    return {"status": status, "job_id": job_id, "schedule": schedule}


async def _wait_for_run(
    engine: AsyncEngine,
    args: argparse.Namespace,
    schedule: str,
    requested: datetime,
    clock: Clock,
) -> str:
    """The manual run asked for at ``requested``, once it has ended, as the command
    prints it; RunNotOkError carrying that when it ended other than ok or is still to
    end after --timeout seconds, and at once, in one line, while it has not started and
    no process leads the schedule or waits to (the request stays queued)."""
    deadline = clock.monotonic() + args.timeout
    while True:
        run = await manual_run(engine, args.job_id, requested, schedule=schedule)
        if run is not None and run["status"] != "running":
            shown = to_json(run) if args.json else _history([run], full=True)
            if run["status"] != "ok":
                raise RunNotOkError(shown)
            return shown
        if run is None and not await _led(engine, schedule, clock):
            raise RunNotOkError(
                f"nothing runs {printable(args.job_id)} now: " + _no_leader(schedule)
            )
        if clock.monotonic() >= deadline:
            state = "has not started" if run is None else "is still running"
            raise RunNotOkError(
                f"the run of {printable(args.job_id)} asked for at {requested.isoformat()} "
                f"{state} after {args.timeout} s (--timeout); see `jobs history "
                f"{printable(args.job_id)}` (is a leader of schedule {schedule} running?)"
            )
        await clock.sleep(_RUN_POLL_SECONDS)


async def _led(engine: AsyncEngine, schedule: str, clock: Clock) -> bool:
    """Whether a process holds the schedule's leader key or waits for it (a standby on
    the key, or behind its host's lock: a leader is coming), as `leader` and
    /health/scheduler read it (operations/leadership.py, on the lease clock)."""
    info = await leadership.leader(engine, lease_now=lease_now(clock), schedule=schedule)
    return info["backend_pid"] is not None or info["standbys"] > 0
