"""Retention: delete tracking events older than TRACKING_EVENT_RETENTION_DAYS, in
batches of 1,000 with a commit per batch, so the sweep never holds a long transaction
and a second run simply finds less to delete."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.scheduler import JobContext, Scheduler, cron

__all__ = ["BATCH_SIZE", "delete_old_events", "register"]

BATCH_SIZE = 1000

_DELETE_BATCH = text(
    """
    DELETE FROM tracking_events WHERE id IN (
        SELECT id FROM tracking_events WHERE occurred_at < :cutoff
        ORDER BY id LIMIT :batch FOR UPDATE SKIP LOCKED
    )
    """
)


async def delete_old_events(session: AsyncSession, now: datetime, retention_days: int) -> int:
    """Delete events older than the retention; return how many, one commit per batch."""
    cutoff = now - timedelta(days=retention_days)
    deleted = 0
    while True:
        async with session.begin():
            result = await session.execute(_DELETE_BATCH, {"cutoff": cutoff, "batch": BATCH_SIZE})
        batch: int = result.rowcount  # type: ignore[attr-defined]
        deleted += batch
        if batch < BATCH_SIZE:
            return deleted


def register(scheduler: Scheduler, retention_days: int) -> None:
    """Daily at 03:30: "Delete expired tracking events"."""

    @scheduler.job(
        cron("30 3 * * *"), id="tracking_retention", name="Delete expired tracking events"
    )
    async def tracking_retention(ctx: JobContext) -> None:
        deleted = await delete_old_events(ctx.session, ctx.clock.now(), retention_days)
        if deleted:
            ctx.log.info("deleted %s tracking event(s) past %s days", deleted, retention_days)
