"""`python -m app prune`: delete, now, the history retention no longer keeps (a
schedule's old runs, its outboxes' old delivered rows), as the regent_retention job
does; or with --dry-run count it."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from ..printable import printable
from ..retention import RetentionPolicy, prunable, prune
from ..scheduler import Clock
from ..scheduler.clock import lease_now
from ..settings import Settings
from .options import add_json, add_schedule_options, schedule_of
from .output import to_json

__all__ = ["add_parser", "execute"]


def add_parser(commands: Any) -> None:
    """Add ``prune`` to an argparse sub-parser set."""
    prune_command = commands.add_parser(
        "prune",
        help="delete the history retention no longer keeps, now (RUN_HISTORY_DAYS, "
        "RUN_HISTORY_KEEP, OUTBOX_DELIVERED_DAYS), as the regent_retention job does",
    )
    prune_command.add_argument(
        "--dry-run", action="store_true", help="print what would be deleted; delete nothing"
    )
    add_json(prune_command)
    add_schedule_options(prune_command, inner=False)


async def execute(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    """Prune (or with --dry-run count) what the settings' RetentionPolicy no longer
    keeps of the schedule the command works on; returns what to print."""
    schedule = schedule_of(args, settings)
    policy = RetentionPolicy.of(settings)
    async with AsyncSession(engine) as session:
        if args.dry_run:
            report = await prunable(session, schedule, policy, lease_now(clock))
        else:
            report = await prune(session, schedule, policy, lease_now(clock))
    if args.json:
        return to_json(
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
