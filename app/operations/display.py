"""How values read to an operator, the same on the admin page and in the CLI.

One timestamp format everywhere (UTC to the second, ``2026-12-02 15:47:37Z``),
booleans as yes/no, durations with their unit (``0 ms`` is a duration, not a blank),
triggers as a human reads them with the zone named, and a stored error cut to the one
line that says what went wrong.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

__all__ = [
    "error_summary",
    "is_never",
    "milliseconds",
    "relative",
    "standbys",
    "timestamp",
    "trigger",
    "unclaimed",
    "yes_no",
]

_EVERY = re.compile(r"^every (\d+(?:\.\d+)?)s$")
_CRON = re.compile(r"^cron '(.+)' (\S+)$")
# The zone word Trigger.describe() stores for a cron without its own zone.
_DEFAULT_ZONE = "default-zone"
_UNITS = ((86400, "d"), (3600, "h"), (60, "min"))
_TRACEBACK = "Traceback (most recent call last):"


def timestamp(moment: datetime | None) -> str:
    """``moment`` in UTC to the second, ``2026-12-02 15:47:37Z``; blank for None;
    ``never`` for PostgreSQL's 'infinity' (read as the last moment a datetime holds)."""
    if moment is None:
        return ""
    if is_never(moment):
        return "never"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def is_never(moment: datetime) -> bool:
    """True for PostgreSQL's 'infinity' as read: datetime.max (an operator's "never")."""
    return moment.replace(tzinfo=None) == datetime.max


def relative(moment: datetime | None, now: datetime) -> str:
    """``in 14 min`` / ``3 d ago`` / ``now``, in the largest whole unit; blank for None
    and for 'infinity'."""
    if moment is None or is_never(moment):
        return ""
    seconds = round((moment - now).total_seconds())
    if seconds == 0:
        return "now"
    return f"in {_span(seconds)}" if seconds > 0 else f"{_span(seconds)} ago"


def _span(seconds: int) -> str:
    """``|seconds|`` in its largest whole unit: ``14 min``, ``3 d``."""
    size = abs(seconds)
    for length, name in _UNITS:
        if size >= length:
            return f"{size // length} {name}"
    return f"{size} s"


def unclaimed(seconds: float | None, held_by: int | None) -> str:
    """``due, not claimed for 3 min; its row is held by backend 4242``: a job's due slot
    or run-now request that no claim has taken for ``seconds`` (on the database's
    clock), and the backend whose transaction holds its row, which the leader's claim
    leaves out until it is free. Blank for None (nothing waits)."""
    if seconds is None:
        return ""
    text = f"due, not claimed for {_span(round(seconds))}"
    if held_by is not None:
        text += f"; its row is held by backend {held_by}"
    return text


def milliseconds(value: int | None) -> str:
    """``0 ms``, ``1500 ms``; blank only when there is no value."""
    return "" if value is None else f"{value} ms"


def yes_no(flag: bool | None) -> str:
    """``yes`` or ``no`` (None, never set, reads no)."""
    return "yes" if flag else "no"


def trigger(stored: str | None, default_zone: str) -> str:
    """A stored trigger description as a human reads it: ``every 15 min``,
    ``cron 0 6 * * * (Europe/Zurich)`` with the scheduler's default zone resolved to
    ``default_zone``. A text of another shape is returned unchanged; none (a broken job
    that never got its row) is empty."""
    if stored is None:
        return ""
    every = _EVERY.match(stored)
    if every is not None:
        seconds = float(every.group(1))
        for length, unit in _UNITS:
            if seconds >= length and seconds % length == 0:
                return f"every {int(seconds // length)} {unit}"
        return f"every {seconds:g} s"
    cron = _CRON.match(stored)
    if cron is not None:
        expression, zone = cron.groups()
        return f"cron {expression} ({default_zone if zone == _DEFAULT_ZONE else zone})"
    return stored


def error_summary(error: str | None) -> str:
    """The one line of a stored error that says what went wrong: for a traceback the
    exception line of the last one printed (the error raised), else the first line
    with text. Blank for None."""
    if not error:
        return ""
    lines = error.splitlines()
    if _TRACEBACK in lines:
        after = lines[len(lines) - 1 - lines[::-1].index(_TRACEBACK) + 1 :]
        for line in after:
            if line.strip() and not line[0].isspace():
                return line.strip()
    return next((line.strip() for line in lines if line.strip()), "")


def standbys(on_key: int, behind_host_lock: int) -> str:
    """The standbys waiting for a leader key, where they wait:
    ``3 standbys: 1 on the key, 2 behind the host lock``."""
    total = on_key + behind_host_lock
    noun = "standby" if total == 1 else "standbys"
    return f"{total} {noun}: {on_key} on the key, {behind_host_lock} behind the host lock"
