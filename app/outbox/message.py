"""What a ``deliver`` callable receives, and what a drain reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["DrainReport", "Enqueued", "Message", "StuckReset"]


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
    """What one drain_once did: the outcomes the database accepted, and ``lost``, the
    deliveries whose outcome was not written because the row was no longer held by
    this drain's claim (logged as ``outbox.claim_lost``)."""

    delivered: int = 0
    retried: int = 0
    stuck: int = 0
    lost: int = 0


@dataclass(frozen=True)
class StuckReset:
    """What a reset of every stuck row of an outbox did: ``reset`` rows made pending
    and due now, ``held`` stuck rows left alone because another transaction held them
    (reset them again once it has ended)."""

    reset: int
    held: int
