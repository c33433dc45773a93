"""How the admin reads the database: now on the lease clock, and rows as plain dicts.

Every admin read of a time compares it with the lease clock (the database server's,
see app/scheduler/clock.py), never with the reader's host; and every row it hands on
carries aware timestamps, an operator's "never" ('infinity') included.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.clock import LEASE_NOW_SQL

__all__ = ["lease_clock_now", "plain_rows"]

_LEASE_CLOCK_NOW = text(f"SELECT {LEASE_NOW_SQL}")


async def lease_clock_now(engine: AsyncEngine, lease_now: datetime | None = None) -> datetime:
    """Now on the lease clock, which every lease and due time is on: ``lease_now`` as
    clock.lease_now gives it, None for the database server's clock (read from it)."""
    async with engine.connect() as conn:
        read: datetime = (
            await conn.execute(_LEASE_CLOCK_NOW, {"lease_now": lease_now})
        ).scalar_one()
        return read


def plain_rows(result: Any) -> list[dict[str, Any]]:
    """The rows of ``result`` as dicts of column to value, every timestamp aware."""
    return [{key: _aware(value) for key, value in row._mapping.items()} for row in result]


def _aware(value: Any) -> Any:
    # asyncpg reads a timestamptz 'infinity' (an operator's "never") or '-infinity' as
    # a naive datetime.max or .min; every other one is aware. Made aware (UTC), they
    # compare, sort and serialize as the rest do; display.timestamp() says "never" for
    # the first.
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
