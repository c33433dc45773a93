"""`python -m app leader`: a schedule's leader (its pid, host and since when) and the
standbys waiting, on its key and behind their host's lock."""

from __future__ import annotations

import argparse
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from ..operations import display, leadership
from ..scheduler import Clock
from ..scheduler.clock import lease_now
from ..settings import Settings
from .options import add_json, add_schedule_options, schedule_of
from .output import table, to_json

__all__ = ["add_parser", "execute"]


def add_parser(commands: Any) -> None:
    """Add ``leader`` to an argparse sub-parser set."""
    leader = commands.add_parser("leader", help="show the leader and the standbys waiting")
    add_json(leader)
    add_schedule_options(leader, inner=False)


async def execute(
    engine: AsyncEngine, args: argparse.Namespace, settings: Settings, clock: Clock
) -> str:
    """The leader of the schedule the command works on, and its standbys, as the
    command prints them."""
    info = await leadership.leader(
        engine, lease_now=lease_now(clock), schedule=schedule_of(args, settings)
    )
    if args.json:
        return to_json(info)
    waiting = display.standbys(info["standbys_on_key"], info["standbys_behind_host_lock"])
    if info["backend_pid"] is None:
        return f"no leader of schedule {info['schedule']}; {waiting}"
    columns = ["schedule", "pid", "host", "application_name", "since"]
    return f"{table([info], columns)}\n{waiting}"
