"""What a ``deliver`` callable receives, and what a drain reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DrainReport", "Enqueued", "Message"]


@dataclass(frozen=True)
class Message:
    """One delivery attempt of one outbox row."""

    id: int
    outbox: str
    key: str
    payload: Any
    attempts: int

    @property
    def idempotency_key(self) -> str:
        """``<outbox>:<key>``: the same on every attempt, for the receiver to dedupe on."""
        return f"{self.outbox}:{self.key}"


@dataclass(frozen=True)
class Enqueued:
    """The row an enqueue wrote, or the one that already had that key."""

    id: int
    created: bool


@dataclass
class DrainReport:
    """What one drain_once did."""

    delivered: int = 0
    retried: int = 0
    stuck: int = 0

    def add(self, other: DrainReport) -> None:
        """Sum another report into this one."""
        self.delivered += other.delivered
        self.retried += other.retried
        self.stuck += other.stuck
