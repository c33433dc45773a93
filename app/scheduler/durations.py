"""Durations as the public API takes them: a number of seconds (an int or a float,
never a bool) or a timedelta, read as a finite float, once for every caller (a
trigger's period, a job's options, an outbox's timeouts and backoff). An int too large
for a float (``10**400``) is no number of seconds, as NaN and the infinities are not:
each caller refuses it with its own error naming the argument, never a raw
OverflowError."""

from __future__ import annotations

import math
from datetime import timedelta

__all__ = ["finite_number", "finite_seconds"]


def finite_number(value: object) -> float | None:
    """``value`` as a finite float when it is an int or a float (not a bool) a float can
    hold; None otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def finite_seconds(value: object) -> float | None:
    """``value`` (a number of seconds or a timedelta) as finite seconds, as finite_number
    reads a number; None for anything else."""
    if isinstance(value, timedelta):
        return value.total_seconds()
    return finite_number(value)
