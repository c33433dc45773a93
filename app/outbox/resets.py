"""An operator's resets of an outbox's rows: one row made due again, or every stuck row
at once. A reset never takes a row from a live claim (a drain delivering it would have
it delivered twice), and answers MessageBusyError for a row held elsewhere past its
wait; reset_stuck skips (and counts) the rows held elsewhere. Used by Outbox.reset and
the admin API, page and CLI.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.rowlocks import RowHeldError, patient_write, row_holder

from ..invocation import program
from . import sql
from .errors import (
    MessageBusyError,
    MessageDeliveredError,
    MessageInFlightError,
    UnknownMessageError,
)
from .message import StuckReset

__all__ = ["reset_message", "reset_stuck"]

_RESET_ROW_HOLDER = row_holder("outbox_messages", "id = :id AND outbox = :outbox")


async def reset_message(
    engine: AsyncEngine, outbox: str, message_id: int, lease_now: datetime | None = None
) -> None:
    """Set a stuck row, or a pending row no live drain holds, to pending, attempts 0,
    due now, and wake the drain. "Now" and whether a drain's lease still runs are read
    on the lease clock (app/scheduler/clock.py): ``lease_now`` as clock.lease_now gives
    it, None for the database server's clock; the caller's own clock never decides.

    Raises UnknownMessageError for an id the outbox does not have,
    MessageDeliveredError for a row that was delivered (it is never sent again),
    MessageInFlightError for a row a drain has claimed and whose lease still runs (the
    drain is delivering it; a reset would have it delivered twice), and
    MessageBusyError, naming the holder's backend pid, for a row another transaction
    holds past the wait of an operator's write (rowlocks.patient_write: 10 s).
    """
    params = {"id": message_id, "outbox": outbox, "lease_now": lease_now}
    try:
        async with patient_write(engine, _RESET_ROW_HOLDER, params) as conn:
            if (await conn.execute(sql.RESET, params)).scalar() is not None:
                await conn.execute(sql.NOTIFY, {"outbox": outbox})
                return
            found = (await conn.execute(sql.SELECT_STATUS, params)).one_or_none()
    except RowHeldError as exc:
        raise MessageBusyError(outbox, message_id, exc.held_by) from None
    if found is None:
        raise UnknownMessageError(
            f"outbox {outbox!r} has no message {message_id}; list the stuck ones with "
            f"`{program()} outbox stuck {outbox}`"
        )
    if found.status == "delivered":
        raise MessageDeliveredError(
            f"outbox {outbox!r} message {message_id} was delivered; it is never sent again"
        )
    raise MessageInFlightError(outbox, message_id, found.next_attempt_at)


async def reset_stuck(
    engine: AsyncEngine, outbox: str, lease_now: datetime | None = None
) -> StuckReset:
    """Make every stuck row of ``outbox`` pending, attempts 0 and due now, as
    reset_message makes one, in one statement, and wake the drain. A row another
    transaction holds is never waited on: it is left stuck and counted as ``held``.
    "Now" is read on the lease clock (``lease_now`` as clock.lease_now gives it, None
    for the database server's clock)."""
    async with engine.begin() as conn:
        row = (
            await conn.execute(sql.RESET_STUCK, {"outbox": outbox, "lease_now": lease_now})
        ).one()
    return StuckReset(reset=row.reset, held=row.held)
