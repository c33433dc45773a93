"""Retention: the engine's own leader-only job that keeps history bounded.

Run history (``scheduler_runs``) is kept for RUN_HISTORY_DAYS but never fewer than the
last RUN_HISTORY_KEEP runs of each job; delivered outbox rows are kept for
OUTBOX_DELIVERED_DAYS; pending and stuck outbox rows and running runs are never
deleted. The deletes themselves belong to their owners (app/scheduler/store/retention.py
for runs, app/outbox/retention.py for delivered rows): this module, which knows both,
runs them as one job, ``regent_retention``, that ``create_app`` registers on the app's
scheduler. It is an ordinary leader-only job: the leader claims its slots (so one
process prunes at a time), it is listed in the admin page and ``python -m app jobs``,
and it can be paused or run now like any other.

A pass deletes in batches of BATCH_SIZE rows, one short statement and one commit each,
until a batch comes back short; a pass killed mid-way has committed what it removed, and
the next one (the next slot, hourly) goes on from what is left. Each pass logs
``retention.pruned`` with what it removed and adds it to ``regent_retention_removed``.
``python -m app prune --dry-run`` counts what a pass would remove now.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.ext.asyncio import AsyncSession

from .metrics import RETENTION_REMOVED
from .outbox.retention import (
    count_prunable_delivered,
    forget_old_delivery_counts,
    outboxes_of,
    prune_delivered_batch,
)
from .scheduler import JobContext, Scheduler, every
from .scheduler.clock import lease_now
from .scheduler.store.retention import count_prunable_runs, prune_runs_batch
from .settings import Settings

__all__ = [
    "BATCH_SIZE",
    "RETENTION_JOB_ID",
    "PruneReport",
    "RetentionPolicy",
    "prunable",
    "prune",
    "register",
]

logger = logging.getLogger("app.retention")

RETENTION_JOB_ID = "regent_retention"
# Small enough that each delete holds its rows for milliseconds, large enough that a
# backlog of millions goes in minutes.
BATCH_SIZE = 1000


@dataclass(frozen=True)
class RetentionPolicy:
    """How much history to keep (the settings of the same names)."""

    run_history_days: float
    run_history_keep: int
    outbox_delivered_days: float
    batch_size: int = BATCH_SIZE

    @classmethod
    def of(cls, settings: Settings) -> RetentionPolicy:
        """The policy the settings give."""
        return cls(
            run_history_days=settings.RUN_HISTORY_DAYS,
            run_history_keep=settings.RUN_HISTORY_KEEP,
            outbox_delivered_days=settings.OUTBOX_DELIVERED_DAYS,
        )


@dataclass
class PruneReport:
    """Rows a pass removed (or, for a dry run, would remove): runs, and delivered rows
    per outbox."""

    runs: int = 0
    delivered: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        """Every row counted, runs and delivered rows."""
        return self.runs + sum(self.delivered.values())


async def prune(
    session: AsyncSession,
    schedule: str,
    policy: RetentionPolicy,
    lease_now: datetime | None = None,
) -> PruneReport:
    """Delete the history ``policy`` no longer keeps, of schedule ``schedule``: its
    runs, and the delivered rows of the outboxes it drains; in batches, each committed
    on its own (``session`` must have no transaction open). ``lease_now`` as
    clock.lease_now gives it (None: the database server's clock)."""
    report = PruneReport()
    while True:
        deleted = await prune_runs_batch(
            session,
            schedule=schedule,
            days=policy.run_history_days,
            keep=policy.run_history_keep,
            batch=policy.batch_size,
            lease_now=lease_now,
        )
        report.runs += deleted
        RETENTION_REMOVED.labels("scheduler_runs").inc(deleted)
        if deleted < policy.batch_size:
            break
    for outbox in await outboxes_of(session, schedule):
        report.delivered[outbox] = 0
        while True:
            deleted = await prune_delivered_batch(
                session,
                outbox=outbox,
                days=policy.outbox_delivered_days,
                batch=policy.batch_size,
                lease_now=lease_now,
            )
            report.delivered[outbox] += deleted
            RETENTION_REMOVED.labels("outbox_messages").inc(deleted)
            if deleted < policy.batch_size:
                break
        await forget_old_delivery_counts(session, outbox=outbox, lease_now=lease_now)
    return report


async def prunable(
    session: AsyncSession,
    schedule: str,
    policy: RetentionPolicy,
    lease_now: datetime | None = None,
) -> PruneReport:
    """What ``prune`` would delete now, counted; deletes nothing."""
    report = PruneReport(
        runs=await count_prunable_runs(
            session,
            schedule=schedule,
            days=policy.run_history_days,
            keep=policy.run_history_keep,
            lease_now=lease_now,
        )
    )
    for outbox in await outboxes_of(session, schedule):
        report.delivered[outbox] = await count_prunable_delivered(
            session, outbox=outbox, days=policy.outbox_delivered_days, lease_now=lease_now
        )
    return report


def register(scheduler: Scheduler, settings: Settings) -> None:
    """Register the ``regent_retention`` job (hourly, leader-only) on ``scheduler``,
    with the policy of ``settings``; nothing when it already has it (an app built twice
    on one scheduler)."""
    if RETENTION_JOB_ID in scheduler.jobs:
        return
    policy = RetentionPolicy.of(settings)

    @scheduler.job(
        every(hours=1),
        id=RETENTION_JOB_ID,
        name="Prune run history and delivered outbox rows",
    )
    async def regent_retention(ctx: JobContext) -> None:
        report = await prune(ctx.session, ctx.schedule, policy, lease_now(ctx.clock))
        logger.info(
            "retention.pruned: %s run(s), %s delivered outbox row(s)",
            report.runs,
            sum(report.delivered.values()),
            extra={
                "action": "retention.pruned",
                "job_id": RETENTION_JOB_ID,
                "pid": os.getpid(),
                "schedule": ctx.schedule,
                "runs": report.runs,
                "delivered": report.delivered,
            },
        )
