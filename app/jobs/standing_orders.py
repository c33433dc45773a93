"""Standing orders: the advance-then-commit pattern.

Each due template gets its journal entry and its next_due_date advanced in one commit,
so a second run finds nothing due. Per template, not per batch: one template's failure
rolls back no other. A UNIQUE (template_id, entry_date) on the journal is the second
wall. This job is sync on purpose, the worked example of a thread job.

Each commit is fenced by the run's leadership term (``ctx.fence_sync``): a thread runs
on after its leader lost the key, and once a newer leadership began it posts nothing
more; the run ends there, it does not skip to the next template.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import date

from sqlalchemy import text
from sqlalchemy.orm import Session

from app.scheduler import JobContext, LeadershipLostError, Scheduler, cron

__all__ = ["generate_due_entries", "register"]

logger = logging.getLogger("app.jobs.standing_orders")

_NEXT_DUE = text(
    """
    SELECT id, workspace_id, description, amount_cents, interval_months, next_due_date
    FROM standing_order_templates
    WHERE next_due_date <= :today AND id <> ALL(:failed)
    ORDER BY next_due_date, id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
    """
)
_ENTRY = text(
    """
    INSERT INTO journal_entries (workspace_id, template_id, entry_date, description, amount_cents)
    VALUES (:workspace_id, :id, :next_due_date, :description, :amount_cents)
    """
)
_ADVANCE = text(
    """
    UPDATE standing_order_templates
    SET next_due_date = next_due_date + make_interval(months => interval_months)
    WHERE id = :id
    """
)


def generate_due_entries(
    session: Session, today: date, fence: Callable[[Session], None] | None = None
) -> int:
    """Post one journal entry per due template occurrence; return how many.

    A template several periods behind gets one entry per period, each in its own commit.
    ``fence`` (the job's ``ctx.fence_sync``) runs inside each commit's transaction; the
    LeadershipLostError it raises ends the run with that entry rolled back.
    """
    posted = 0
    failed: list[int] = []
    while True:
        row = None
        try:
            with session.begin():
                row = session.execute(_NEXT_DUE, {"today": today, "failed": failed}).first()
                if row is None:
                    return posted
                session.execute(_ENTRY, row._asdict())
                session.execute(_ADVANCE, {"id": row.id})
                if fence is not None:
                    fence(session)
            posted += 1
        except LeadershipLostError:
            raise
        except Exception:
            logger.exception("standing order template failed; the others continue")
            if row is not None:
                failed.append(row.id)


def register(scheduler: Scheduler) -> None:
    """Daily at 06:00 in the TIMEZONE setting: "Generate standing order entries"."""

    @scheduler.job(cron("0 6 * * *"), id="standing_orders", name="Generate standing order entries")
    def standing_orders(ctx: JobContext) -> None:
        local_today = ctx.scheduled_at.astimezone(ctx.zone).date()
        posted = generate_due_entries(ctx.sync_session, local_today, fence=ctx.fence_sync)
        if posted:
            ctx.log.info("posted %s standing order entr(ies)", posted)
