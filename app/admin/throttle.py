"""Slowing wrong tokens from one client, on the sign-in page and the bearer APIs alike.

A wrong token is counted against its client (the peer address; behind a proxy named in
TRUSTED_PROXIES, the address it forwards). The first FREE_FAILURES are answered 401 at
once; after that the client must wait BASE_DELAY, doubling with each further counted
failure up to MAX_DELAY, and a wrong token sent meanwhile is answered 429 with
Retry-After and not counted. A count untouched for FORGET_AFTER starts over.

The right token is never refused and never clears a count: wrong tokens sent by someone
else from the admin's address (another local user, a proxy's other clients) cannot lock
the admin out, nor can the admin's sign-in forgive them. Against guessing, the lock is
the token's length (settings refuse one shorter than 32 characters); this throttle is
the second line, which tells a client that keeps failing to stop.

Check and count are one statement on one row, so concurrent wrong tokens, in one worker
or many, are counted one by one. Counts and waits are read on the lease clock (the
database server's, see app/scheduler/clock.py), so a worker whose clock runs ahead or
behind neither lengthens nor shortens a wait.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.clock import LEASE_NOW_SQL

__all__ = ["BASE_DELAY", "FORGET_AFTER", "FREE_FAILURES", "MAX_DELAY", "count_wrong_token"]

FREE_FAILURES = 5
BASE_DELAY = timedelta(seconds=30)
MAX_DELAY = timedelta(minutes=15)
FORGET_AFTER = timedelta(days=1)


def _wait_sql(failures: str) -> str:
    """The wait a client has earned after ``failures`` counted wrong tokens."""
    return f"""(CASE WHEN {failures} < CAST(:free AS integer) THEN interval '0' ELSE least(
        make_interval(secs => CAST(:base AS double precision)
            * power(2, least({failures} - CAST(:free AS integer), 16))),
        make_interval(secs => CAST(:max AS double precision))) END)"""


_FORGET_AFTER = "make_interval(secs => CAST(:forget AS double precision))"

# The row's client has had its free failures and the wait they earned has not passed.
# The failures guard matters: a concurrent statement's now, read before it waited for
# the row, may be earlier than the last failure, which is no wait while failures are free.
_INSIDE_WAIT = (
    "(f.failures >= CAST(:free AS integer) AND excluded.last_failure_at"
    f" < f.last_failure_at + {_wait_sql('f.failures')})"
)

# One row per client, locked by the upsert (also when its WHERE leaves it as it was): a
# wrong token inside the wait is refused and not counted, and returns no row; any other
# is counted (a forgotten count starting over at 1) and returns it.
_COUNT = text(
    f"""
    INSERT INTO admin_login_failures AS f (client, failures, last_failure_at)
    VALUES (:client, 1, {LEASE_NOW_SQL})
    ON CONFLICT (client) DO UPDATE SET
        failures = CASE
            WHEN f.last_failure_at < excluded.last_failure_at - {_FORGET_AFTER} THEN 1
            ELSE f.failures + 1 END,
        last_failure_at = excluded.last_failure_at
    WHERE NOT {_INSIDE_WAIT}
    RETURNING failures
    """
)
_REMAINING = text(
    f"""
    SELECT extract(epoch FROM last_failure_at + {_wait_sql("failures")} - {LEASE_NOW_SQL})
        ::float
    FROM admin_login_failures WHERE client = :client
    """
)
_FORGET = text(
    f"DELETE FROM admin_login_failures WHERE last_failure_at < {LEASE_NOW_SQL} - {_FORGET_AFTER}"
)


async def count_wrong_token(
    engine: AsyncEngine, client: str, lease_now: datetime | None = None
) -> int:
    """Record a wrong token from ``client``; return 0 when it was counted (answer 401),
    else the whole seconds the client must still wait (answer 429 with Retry-After).
    Read on the lease clock: ``lease_now`` as clock.lease_now gives it, None for the
    database server's. Counts nobody touched for FORGET_AFTER are dropped."""
    params = {
        "client": client,
        "lease_now": lease_now,
        "forget": FORGET_AFTER.total_seconds(),
        "free": FREE_FAILURES,
        "base": BASE_DELAY.total_seconds(),
        "max": MAX_DELAY.total_seconds(),
    }
    async with engine.begin() as conn:
        counted = (await conn.execute(_COUNT, params)).first() is not None
        remaining: float = 0 if counted else (await conn.execute(_REMAINING, params)).scalar_one()
        await conn.execute(_FORGET, params)
    return 0 if counted else max(1, math.ceil(remaining))
