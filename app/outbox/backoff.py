"""When a failed delivery is tried again: a table of delays, walked as app.backoff.Backoff
walks every retry of Regent's."""

from __future__ import annotations

from collections.abc import Sequence

from app.backoff import Backoff

__all__ = ["DEFAULT_BACKOFF", "retry_delay"]

DEFAULT_BACKOFF: tuple[int, ...] = (5, 15, 60, 300, 900, 3600)


def retry_delay(attempts: int, backoff: Sequence[float] = DEFAULT_BACKOFF) -> float:
    """Seconds to wait after the ``attempts``-th failed attempt (1-based).

    The table is walked one step per attempt and then repeats its last entry. Raises
    ValueError for ``attempts`` below 1.
    """
    if attempts < 1:
        raise ValueError(f"attempts counts from 1, got {attempts}")
    return Backoff.of(backoff).delay(attempts)
