"""An outbox's messages as operators read and change them: its stuck, pending and
scheduled rows listed, and one row reset.

Shared by the admin API, the admin page and the CLI; raises AdminError subclasses whose
messages name the problem.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.outbox import (
    MessageBusyError,
    MessageDeliveredError,
    MessageInFlightError,
    UnknownMessageError,
    reset_message,
)
from app.outbox.sql import SCHEDULED
from app.storable import is_int64

from .errors import Conflict, NotFound
from .outboxes import require_outbox
from .reading import plain_rows

__all__ = ["outbox_messages", "reset_outbox_message", "stuck_messages"]

_STUCK = text(
    """
    SELECT id, outbox, key, payload, attempts, last_error, created_at, updated_at
    FROM outbox_messages
    WHERE status = 'stuck' AND (CAST(:outbox AS text) IS NULL OR outbox = :outbox)
    ORDER BY id LIMIT :limit
    """
)
_PENDING = text(
    f"""
    SELECT id, outbox, key, payload, attempts, next_attempt_at, last_error, created_at,
        updated_at
    FROM outbox_messages
    WHERE status = 'pending' AND NOT {SCHEDULED}
        AND (CAST(:outbox AS text) IS NULL OR outbox = :outbox)
    ORDER BY next_attempt_at, id LIMIT :limit
    """
)
_SCHEDULED = text(
    f"""
    SELECT id, outbox, key, payload, deliver_at, created_at
    FROM outbox_messages
    WHERE {SCHEDULED} AND (CAST(:outbox AS text) IS NULL OR outbox = :outbox)
    ORDER BY deliver_at, id LIMIT :limit
    """
)
_MESSAGES_BY_STATUS = {"stuck": _STUCK, "pending": _PENDING, "scheduled": _SCHEDULED}


async def stuck_messages(
    engine: AsyncEngine, outbox: str | None = None, *, limit: int = 100
) -> list[dict[str, Any]]:
    """Stuck rows, oldest first, of one outbox or all. Raises NotFound for an unknown one."""
    return await outbox_messages(engine, outbox, status="stuck", limit=limit)


async def outbox_messages(
    engine: AsyncEngine,
    outbox: str | None = None,
    *,
    status: Literal["stuck", "pending", "scheduled"],
    limit: int = 100,
    lease_now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Rows of one status, of one outbox or all: stuck rows oldest first with their last
    error, pending rows in the order the drain takes them, scheduled rows (delayed
    messages whose moment, ``deliver_at``, is ahead on the lease clock: ``lease_now``
    as clock.lease_now gives it) soonest first. Raises NotFound for an unknown outbox."""
    if outbox is not None:
        await require_outbox(engine, outbox)
    async with engine.connect() as conn:
        query = _MESSAGES_BY_STATUS[status]
        params = {"outbox": outbox, "limit": limit, "lease_now": lease_now}
        return plain_rows(await conn.execute(query, params))


async def reset_outbox_message(
    engine: AsyncEngine, outbox: str, message_id: int, lease_now: datetime | None = None
) -> None:
    """Make a stuck row, or a pending one no drain holds, pending with attempts 0 and
    due now, both read on the lease clock (``lease_now`` as clock.lease_now gives it,
    None for the database server's; never the operator's own clock). NotFound for an
    unknown outbox or id; Conflict for a delivered row, one a drain is delivering (the
    message says to wait for it), and one another transaction holds past the wait of
    an operator's write (the message names its backend pid)."""
    await require_outbox(engine, outbox)
    if not is_int64(message_id):
        raise NotFound(f"outbox {outbox!r} has no message {message_id}; no id is that large")
    try:
        await reset_message(engine, outbox, message_id, lease_now)
    except UnknownMessageError as exc:
        raise NotFound(str(exc)) from None
    except (MessageBusyError, MessageDeliveredError, MessageInFlightError) as exc:
        raise Conflict(str(exc)) from None
