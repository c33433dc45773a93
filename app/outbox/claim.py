"""A drain's claim of due rows: one statement that leases them to it under a token,
and the give-back of the rows that could not start in time.

The lease a claim sets is the delivery timeout plus a 30 s margin (policy.py), on the
lease clock (the database server's: see app/scheduler/clock.py), so that no drain's
own clock decides whether another's claim still holds. A row starts only within the
first half of that margin (START_WINDOW_SECONDS after its claim, on this process's
monotonic clock: an elapsed time, which neither an offset between hosts' clocks nor a
step of this host's wall clock changes), checked as each delivery begins, a drain's or
an inline attempt's; ``asyncio.timeout`` cuts its delivery off at delivery_timeout, so
every delivery ends at least 15 s before its lease runs out, and no other drain can
claim a row while it is being delivered. A row that could not start in time is given
back, due now, and claimed again with a fresh lease.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import TextClause

from app.scheduler import Clock
from app.scheduler.clock import lease_now
from app.scheduler.start_window import StartWindow

from . import sql
from .connection import fetch
from .message import Message
from .policy import START_WINDOW_SECONDS, DrainPolicy

__all__ = ["Claim", "release"]


@dataclass(frozen=True)
class Claim:
    """Rows claimed under one token. ``taken_at`` is this process's monotonic clock read
    just before the claim: the claim's start window and lease are measured from it, as
    elapsed times, which neither an offset between hosts' clocks nor a step of this
    host's wall clock (NTP) changes; the lease in the database runs from a later moment,
    so both end here no later than there."""

    token: uuid.UUID
    taken_at: float
    lease_seconds: float
    messages: list[Message]

    @classmethod
    async def take(
        cls,
        connection: Any,
        statement: TextClause,
        params: dict[str, Any],
        policy: DrainPolicy,
        clock: Clock,
    ) -> Claim:
        """Claim, on ``connection``, the rows ``statement`` (sql.CLAIM_DUE or CLAIM_ONE,
        with ``params``) finds due and no live claim holds, under a new token and the
        policy's lease on the lease clock of ``clock``; the claim may hold no row."""
        # Read before the claim: its start window ends no later than the lease allows.
        taken_at = clock.monotonic()
        token = uuid.uuid4()
        result = await fetch(
            connection,
            statement,
            {
                "outbox": policy.outbox,
                "lease_now": lease_now(clock),
                "lease_seconds": policy.lease.total_seconds(),
                "token": token,
            }
            | params,
        )
        outbox = policy.outbox
        # SQLAlchemy's asyncpg dialect registers the jsonb codec: payloads arrive decoded.
        messages = [Message(r["id"], outbox, r["key"], r["payload"], r["attempts"]) for r in result]
        return cls(token, taken_at, policy.lease.total_seconds(), messages)

    @functools.cached_property
    def window(self) -> StartWindow:
        """When a row of the claim may start: within START_WINDOW_SECONDS of it (made
        once: every row's delivery checks it as it begins)."""
        return StartWindow(self.taken_at, START_WINDOW_SECONDS)

    @property
    def lease_ends(self) -> float:
        """The monotonic moment by which the claim's lease has run out."""
        return self.taken_at + self.lease_seconds


async def release(connection: Any, token: uuid.UUID, messages: list[Message], clock: Clock) -> None:
    """Give ``messages``, claimed under ``token``, back on ``connection``: due now on the
    lease clock of ``clock``, free for the next claim. A row no longer under that token
    is left as it is, and one another transaction holds is left to its lease, never
    waited on."""
    await fetch(
        connection,
        sql.RELEASE,
        {
            "ids": [m.id for m in messages],
            "token": token,
            "lease_now": lease_now(clock),
        },
    )
