"""The options the operator commands share, and what they resolve to: whole numbers in
a range, --schedule and --app (the schedule a command works on: see app/cli/__init__.py),
--json."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..app_target import DEFAULT_APP, load_scheduler
from ..scheduler import InvalidScheduleNameError
from ..scheduler.keys import validate_schedule_name
from ..settings import Settings

__all__ = ["add_json", "add_schedule_options", "int_between", "schedule_of"]


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


def add_schedule_options(parser: argparse.ArgumentParser, *, inner: bool) -> None:
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


def add_json(parser: argparse.ArgumentParser) -> None:
    """--json on `python -m app`, a command or a sub-command. Each leaves it unset when
    not given, so one given before holds: ``python -m app --json jobs history ID``,
    ``jobs --json history ID`` and ``jobs history ID --json`` print JSON alike (a
    command's default would overwrite the one given before it). Unset reads as false
    (commands.run_command)."""
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print JSON instead of a table",
    )


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
