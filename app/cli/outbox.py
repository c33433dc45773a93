"""`python -m app outbox`: each outbox with its counts; its pending, scheduled and stuck
rows; reset one stuck row or every one; forget a retired outbox."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from ..invocation import program
from ..operations import display, outboxes
from ..operations.messages import outbox_messages, reset_outbox_message
from ..printable import printable
from ..scheduler import Clock
from ..scheduler.clock import lease_now
from ..settings import Settings
from .errors import UsageError
from .options import add_json
from .output import table, to_json

__all__ = ["OUTBOX_COMMANDS", "add_parser", "check_usage", "execute"]

OUTBOX_COMMANDS = "{list,pending,scheduled,stuck,reset,forget}"


def add_parser(commands: Any) -> None:
    """Add ``outbox`` and its sub-commands (OUTBOX_COMMANDS) to an argparse sub-parser
    set."""
    outbox = commands.add_parser(
        "outbox", help="outboxes and their rows: list, pending, scheduled, stuck, reset"
    )
    add_json(outbox)
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
        add_json(reader)
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
    add_json(forget_outbox)
    add_json(reset)
    reset.add_argument(
        "--all-stuck",
        action="store_true",
        help="reset every stuck row of the outbox in one statement (rows another "
        "transaction holds are left alone and counted)",
    )


def check_usage(args: argparse.Namespace) -> None:
    """Raise UsageError, saying what the command takes, for an ``outbox`` command given
    without its sub-command, or a reset given neither or both of a message ID and
    --all-stuck; before the database is reached."""
    resetting = args.outbox_command == "reset"
    if resetting and (args.message_id is None) == (not args.all_stuck):
        raise UsageError(
            f"`{program()} outbox reset NAME` takes a message ID or --all-stuck "
            "(one of them, not both)"
        )
    if args.outbox_command is None:
        raise UsageError(
            f"`{program()} outbox` needs a sub-command, one of {OUTBOX_COMMANDS}: list "
            "(counts per status), pending [NAME], scheduled [NAME], stuck [NAME], reset NAME "
            "(ID | --all-stuck), forget NAME"
        )


async def execute(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    """Run an ``outbox`` command (check_usage passed); returns what to print. Raises
    AdminError as the admin queries do (NotFound for an unknown outbox or message,
    Conflict for a row in flight or held, or an outbox an app still drains)."""
    if args.outbox_command == "reset" and args.all_stuck:
        done = await outboxes.reset_all_stuck(engine, args.name, lease_now(clock))
        if args.json:
            return to_json({"status": "pending", "outbox": args.name} | done)
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
        if args.json:
            return to_json(
                {"status": "pending", "outbox": args.name, "message_id": args.message_id}
            )
        name = printable(args.name)
        return f"outbox '{name}' message {args.message_id} is pending again, due now"
    if args.outbox_command == "forget":
        deleted = await outboxes.forget_outbox(engine, args.name)
        if args.json:
            return to_json(
                {"status": "forgotten", "outbox": args.name, "messages_deleted": deleted}
            )
        return f"forgot outbox '{printable(args.name)}' and its {deleted} message(s)"
    if args.outbox_command == "list":
        summary = await outboxes.list_outboxes(engine, lease_now(clock), retired=args.all)
        if args.json:
            return to_json(summary)
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
        return table(rows, columns)
    status = args.outbox_command
    rows = await outbox_messages(engine, args.name, status=status, lease_now=lease_now(clock))
    if args.json:
        return to_json(rows)
    if not rows:
        return f"no {status} rows"
    if status == "scheduled":
        return table(rows, ["id", "outbox", "key", "deliver_at", "created_at"])
    when = "next_attempt_at" if status == "pending" else "updated_at"
    summed_up = [row | {"last_error": display.error_summary(row["last_error"])} for row in rows]
    return table(summed_up, ["id", "outbox", "key", "attempts", when, "last_error"])
