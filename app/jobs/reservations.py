"""Stale reservation sweep, on every replica: an idempotent conditional UPDATE.

Credit reservations held for more than 15 minutes are refunded to their workspace. The
refund matches only rows still ``held``, in one statement, so two workers sweeping at
once refund each reservation once, and a settled one matches nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.scheduler import JobContext, Scheduler, every

__all__ = ["STALE_AFTER", "refund_stale_reservations", "register"]

STALE_AFTER = timedelta(minutes=15)

_REFUND = text(
    """
    WITH refunded AS (
        UPDATE credit_reservations SET status = 'refunded', settled_at = :now
        WHERE status = 'held' AND created_at < :cutoff
        RETURNING workspace_id, amount
    ), totals AS (
        SELECT workspace_id, sum(amount) AS amount, count(*) AS reservations
        FROM refunded GROUP BY workspace_id
    ), credited AS (
        UPDATE workspaces AS w SET credit_balance = w.credit_balance + t.amount
        FROM totals AS t WHERE w.id = t.workspace_id
        RETURNING t.reservations
    )
    SELECT coalesce(sum(reservations), 0) FROM credited
    """
)


async def refund_stale_reservations(session: AsyncSession, now: datetime) -> int:
    """Refund every reservation held past STALE_AFTER; return how many."""
    async with session.begin():
        result = await session.execute(_REFUND, {"now": now, "cutoff": now - STALE_AFTER})
        return int(result.scalar_one())


def register(scheduler: Scheduler) -> None:
    """Every 5 minutes on every worker: "Refund stale credit reservations"."""

    @scheduler.job(
        every(minutes=5),
        id="stale_reservation_sweep",
        name="Refund stale credit reservations",
        leader_only=False,
        jitter=30,
    )
    async def stale_reservation_sweep(ctx: JobContext) -> None:
        refunded = await refund_stale_reservations(ctx.session, ctx.clock.now())
        if refunded:
            ctx.log.info("refunded %s stale reservation(s)", refunded)
