"""The one shape of every wait between failed attempts, in the scheduler and the outbox.

A policy is a table of delays: the first failure in a row waits the first entry, each
further failure the next, and past its end the last entry repeats. Every retry in
Regent (reaching the database, renewing a lease, restarting a crashed service or
supervisor, writing an outcome again, trying a broken job again, delivering an outbox
message again) is one Backoff, so a policy is read and tested in one place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Delays, in seconds, between failed attempts; the last one repeats.

    Raises ValueError at construction for an empty table or a negative delay: a policy
    is set once, where its mistake can still be read.
    """

    delays: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.delays:
            raise ValueError("a Backoff needs at least one delay")
        if any(delay < 0 for delay in self.delays):
            raise ValueError(f"a Backoff's delays cannot be negative: {self.delays!r}")

    @classmethod
    def of(cls, delays: Sequence[float]) -> Backoff:
        """A policy from any sequence of seconds (a user's table of retries)."""
        return cls(tuple(float(delay) for delay in delays))

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed attempts in a row, counted from 1:
        the table's entry for that failure, or its last entry past the table's end."""
        if failures < 1:
            raise ValueError(f"failures counts from 1, got {failures}")
        return self.delays[min(failures, len(self.delays)) - 1]
