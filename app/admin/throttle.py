"""Slowing repeated sign-in failures from one client.

The first FREE_FAILURES wrong tokens from a client are answered at once; after that the
client must wait BASE_DELAY, doubling with each further failure up to MAX_DELAY, before
its next attempt is even checked (a right token included), and gets 429 with
Retry-After meanwhile. A success clears its count; a count untouched for FORGET_AFTER
starts over. Counts live in the database, so several workers do not multiply a
client's guesses, and the wait is read on the lease clock (the database server's, see
app/scheduler/clock.py), so a worker whose clock runs ahead or behind neither lengthens
nor shortens it. The client is the peer address: behind a proxy that is the proxy.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.clock import LEASE_NOW_SQL

__all__ = ["clear_failures", "record_failure", "wait_before_attempt"]

FREE_FAILURES = 5
BASE_DELAY = timedelta(seconds=30)
MAX_DELAY = timedelta(minutes=15)
FORGET_AFTER = timedelta(days=1)

# Failures before this are forgotten.
_FORGET_BEFORE = (
    f"({LEASE_NOW_SQL} - make_interval(secs => CAST(:forget_after AS double precision)))"
)
_FAILURES = text(
    f"""
    SELECT failures, extract(epoch FROM {LEASE_NOW_SQL} - last_failure_at)::float AS ago
    FROM admin_login_failures
    WHERE client = :client AND last_failure_at >= {_FORGET_BEFORE}
    """
)
_RECORD = text(
    f"""
    INSERT INTO admin_login_failures AS f (client, failures, last_failure_at)
    VALUES (:client, 1, {LEASE_NOW_SQL})
    ON CONFLICT (client) DO UPDATE SET
        failures = CASE WHEN f.last_failure_at < {_FORGET_BEFORE} THEN 1
            ELSE f.failures + 1 END,
        last_failure_at = excluded.last_failure_at
    """
)
_FORGET = text(f"DELETE FROM admin_login_failures WHERE last_failure_at < {_FORGET_BEFORE}")
_CLEAR = text("DELETE FROM admin_login_failures WHERE client = :client")


def _delay(failures: int) -> timedelta:
    if failures < FREE_FAILURES:
        return timedelta(0)
    doublings = min(failures - FREE_FAILURES, 16)
    delay: timedelta = min(BASE_DELAY * 2**doublings, MAX_DELAY)
    return delay


def _params(client: str, lease_now: datetime | None) -> dict[str, object]:
    return {
        "client": client,
        "lease_now": lease_now,
        "forget_after": FORGET_AFTER.total_seconds(),
    }


async def wait_before_attempt(
    engine: AsyncEngine, client: str, lease_now: datetime | None = None
) -> int:
    """Whole seconds ``client`` must still wait before a sign-in attempt; 0 to go on.
    Read on the lease clock: ``lease_now`` as clock.lease_now gives it, None for the
    database server's clock."""
    async with engine.connect() as conn:
        row = (await conn.execute(_FAILURES, _params(client, lease_now))).first()
    if row is None:
        return 0
    remaining: float = _delay(row.failures).total_seconds() - row.ago
    return max(0, math.ceil(remaining))


async def record_failure(
    engine: AsyncEngine, client: str, lease_now: datetime | None = None
) -> None:
    """Count a wrong token from ``client`` at now on the lease clock (``lease_now``, as
    for wait_before_attempt); drop counts nobody touched for a day."""
    params = _params(client, lease_now)
    async with engine.begin() as conn:
        await conn.execute(_RECORD, params)
        await conn.execute(_FORGET, params)


async def clear_failures(engine: AsyncEngine, client: str) -> None:
    """Forget ``client``'s failures after it signed in."""
    async with engine.begin() as conn:
        await conn.execute(_CLEAR, {"client": client})
