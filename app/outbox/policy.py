"""How one outbox delivers (DrainPolicy): its receiver, its limits and its retries,
and the two bounds of every claim its drain makes.

A failed delivery is tried again after a delay from the outbox's ``backoff=`` table
(DEFAULT_BACKOFF unless given: 5, 15, 60, 300, 900, 3600 s), walked as every retry of
Regent's is walked: the policy holds it as one app.backoff.Backoff. A claim's lease is
the delivery timeout plus LEASE_MARGIN_SECONDS; a row starts only within the first
half of that margin (START_WINDOW_SECONDS), leaving the other half to write its
outcome in (claim.py tells why).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

from app.backoff import Backoff

from .message import Message

__all__ = [
    "DEFAULT_BACKOFF",
    "LEASE_MARGIN_SECONDS",
    "START_WINDOW_SECONDS",
    "DrainPolicy",
    "retry_delay",
]

DEFAULT_BACKOFF: tuple[int, ...] = (5, 15, 60, 300, 900, 3600)

LEASE_MARGIN_SECONDS = 30.0
# Half the margin to start in, half to write the outcome in once the delivery ended.
START_WINDOW_SECONDS = LEASE_MARGIN_SECONDS / 2


def retry_delay(attempts: int, backoff: Sequence[float] = DEFAULT_BACKOFF) -> float:
    """Seconds to wait after the ``attempts``-th failed attempt (1-based).

    The table is walked one step per attempt and then repeats its last entry, as
    app.backoff.Backoff walks it. Raises ValueError for ``attempts`` below 1.
    """
    return Backoff.of(backoff).delay(attempts)


@dataclass(frozen=True)
class DrainPolicy:
    """How one outbox delivers: its receiver, limits and backoff."""

    outbox: str
    deliver: Callable[[Message], Awaitable[None]]
    max_attempts: int
    backoff: Backoff
    concurrency: int
    delivery_timeout: float

    @property
    def lease(self) -> timedelta:
        """How long a claim keeps other drains off a row: the delivery timeout and a
        margin. A row starts within the first half of the margin or is given back, so
        a delivery that is still allowed to run is never claimed twice."""
        return timedelta(seconds=self.delivery_timeout + LEASE_MARGIN_SECONDS)
