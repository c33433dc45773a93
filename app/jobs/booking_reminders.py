"""Booking reminders: the stamp-column pattern.

A booking due for its 24 h (or 1 h) reminder and whose stamp column is NULL gets one
SMS; the column is stamped and committed row by row, right after the send. Two runs,
or two processes at once, send one SMS per booking per window: the row is claimed with
FOR UPDATE SKIP LOCKED, so a concurrent run skips it, and a later run finds it stamped.

A booking gets the reminder of the window it is in: one made 30 minutes ahead gets the
1 h reminder only. SMS is at-least-once: a crash between the send and the commit sends
that one reminder again on the next run (money uses claim-before-send instead).
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.scheduler import JobContext, Scheduler, every

from .gateways import SmsGateway

__all__ = ["WINDOWS", "register", "send_due_reminders"]

logger = logging.getLogger("app.jobs.booking_reminders")

# window name -> (stamp column, nearest and farthest start it covers)
WINDOWS: dict[str, tuple[str, timedelta, timedelta]] = {
    "24h": ("reminder_24h_sent_at", timedelta(hours=1), timedelta(hours=24)),
    "1h": ("reminder_1h_sent_at", timedelta(0), timedelta(hours=1)),
}

_NEXT_DUE = """
    SELECT id, phone, starts_at FROM bookings
    WHERE {column} IS NULL AND starts_at > :nearest AND starts_at <= :horizon
      AND id <> ALL(:failed)
    ORDER BY starts_at, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
"""
_STAMP = "UPDATE bookings SET {column} = :now WHERE id = :id"


async def send_due_reminders(session: AsyncSession, sms: SmsGateway, now: datetime) -> int:
    """Send every due reminder once, one commit per booking; return how many were sent.

    An SMS that fails is logged and leaves its column NULL, so the next run retries
    that booking; the others still go out.
    """
    sent = 0
    for window, (column, nearest, farthest) in WINDOWS.items():
        failed: list[int] = []
        while True:
            async with session.begin():
                row = (
                    await session.execute(
                        text(_NEXT_DUE.format(column=column)),
                        {"nearest": now + nearest, "horizon": now + farthest, "failed": failed},
                    )
                ).first()
                if row is None:
                    break
                message = (
                    f"Reminder: your booking starts at {row.starts_at:%Y-%m-%d %H:%M} UTC "
                    f"(in less than {window})."
                )
                try:
                    await sms.send(row.phone, message)
                except Exception:
                    logger.warning("reminder for booking %s failed", row.id, exc_info=True)
                    failed.append(row.id)
                    continue
                await session.execute(
                    text(_STAMP.format(column=column)), {"id": row.id, "now": now}
                )
            sent += 1
    return sent


def register(scheduler: Scheduler, sms: SmsGateway) -> None:
    """Every 15 minutes: "Send booking reminder SMS"."""

    @scheduler.job(every(minutes=15), id="booking_reminders", name="Send booking reminder SMS")
    async def booking_reminders(ctx: JobContext) -> None:
        sent = await send_due_reminders(ctx.session, sms, ctx.clock.now())
        if sent:
            ctx.log.info("sent %s booking reminder(s)", sent)
