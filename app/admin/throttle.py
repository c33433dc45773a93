"""Slowing repeated sign-in failures from one client.

The first FREE_FAILURES wrong tokens from a client are answered at once; after that the
client must wait BASE_DELAY, doubling with each further failure up to MAX_DELAY, before
its next attempt is even checked (a right token included), and gets 429 with
Retry-After meanwhile. A success clears its count; a count untouched for FORGET_AFTER
starts over. Counts live in the database, so several workers do not multiply a
client's guesses. The client is the peer address: behind a proxy that is the proxy.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["clear_failures", "record_failure", "wait_before_attempt"]

FREE_FAILURES = 5
BASE_DELAY = timedelta(seconds=30)
MAX_DELAY = timedelta(minutes=15)
FORGET_AFTER = timedelta(days=1)

_FAILURES = text(
    "SELECT failures, last_failure_at FROM admin_login_failures"
    " WHERE client = :client AND last_failure_at >= :forget"
)
_RECORD = text(
    """
    INSERT INTO admin_login_failures AS f (client, failures, last_failure_at)
    VALUES (:client, 1, :now)
    ON CONFLICT (client) DO UPDATE SET
        failures = CASE WHEN f.last_failure_at < :forget THEN 1 ELSE f.failures + 1 END,
        last_failure_at = :now
    """
)
_FORGET = text("DELETE FROM admin_login_failures WHERE last_failure_at < :forget")
_CLEAR = text("DELETE FROM admin_login_failures WHERE client = :client")


def _delay(failures: int) -> timedelta:
    if failures < FREE_FAILURES:
        return timedelta(0)
    doublings = min(failures - FREE_FAILURES, 16)
    delay: timedelta = min(BASE_DELAY * 2**doublings, MAX_DELAY)
    return delay


async def wait_before_attempt(engine: AsyncEngine, client: str, now: datetime) -> int:
    """Whole seconds ``client`` must still wait before a sign-in attempt; 0 to go on."""
    async with engine.connect() as conn:
        row = (
            await conn.execute(_FAILURES, {"client": client, "forget": now - FORGET_AFTER})
        ).first()
    if row is None:
        return 0
    remaining: float = (row.last_failure_at + _delay(row.failures) - now).total_seconds()
    return max(0, math.ceil(remaining))


async def record_failure(engine: AsyncEngine, client: str, now: datetime) -> None:
    """Count a wrong token from ``client``; drop counts nobody touched for a day."""
    forget = now - FORGET_AFTER
    async with engine.begin() as conn:
        await conn.execute(_RECORD, {"client": client, "now": now, "forget": forget})
        await conn.execute(_FORGET, {"forget": forget})


async def clear_failures(engine: AsyncEngine, client: str) -> None:
    """Forget ``client``'s failures after it signed in."""
    async with engine.begin() as conn:
        await conn.execute(_CLEAR, {"client": client})
