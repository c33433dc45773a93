"""Subscription charging: claim before you send, with a reference.

1. Under ``FOR UPDATE``, write ``pending_charge_ref`` (a uuid), the amount and
   ``claimed_at``, advance ``next_charge_at``, and commit.
2. Only then call the provider, with the reference as its idempotency key.
3. Record the outcome and clear the claim, in one commit.

A claim younger than CHARGE_CLAIM_COOLDOWN_SECONDS is a charge in flight: skipped. An
older one (its runner died between 1 and 3) is reconciled by asking the provider what
became of that reference, never by charging again. A crash before the provider call
loses that cycle's charge; nothing ever charges a card twice.

The claim of step 1 is fenced by the run's leadership term (``ctx.fence``): a run whose
leader lost the key to a newer leadership claims nothing more, so it sends no further
charge. Step 3 is not fenced: it records what the provider already did, which is true
whoever leads now (left unrecorded, it would wait for the cooldown's reconciliation).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.scheduler import JobContext, Scheduler, every

from .gateways import ChargeResult, PaymentProvider

__all__ = ["ChargeReport", "charge_due_subscriptions", "register"]

logger = logging.getLogger("app.jobs.subscriptions")

_NEXT = text(
    """
    SELECT id, amount_cents, pending_charge_ref, pending_amount_cents FROM subscriptions
    WHERE ((pending_charge_ref IS NULL AND next_charge_at <= :now)
           OR (pending_charge_ref IS NOT NULL AND claimed_at < :stale_before))
      AND id <> ALL(:skip)
    ORDER BY id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
    """
)
_CLAIM = text(
    """
    UPDATE subscriptions
    SET pending_charge_ref = :reference, pending_amount_cents = amount_cents, claimed_at = :now,
        next_charge_at = next_charge_at + make_interval(days => interval_days)
    WHERE id = :id
    """
)
_RENEW_CLAIM = text("UPDATE subscriptions SET claimed_at = :now WHERE id = :id")
_RECORD = text(
    """
    INSERT INTO subscription_charges
        (subscription_id, reference, amount_cents, status, provider_charge_id, recorded_at)
    VALUES (:id, :reference, :amount, :status, :charge_id, :now)
    ON CONFLICT (reference) DO NOTHING
    """
)
_CLEAR = text(
    """
    UPDATE subscriptions
    SET pending_charge_ref = NULL, pending_amount_cents = NULL, claimed_at = NULL
    WHERE id = :id AND pending_charge_ref = :reference
    """
)


@dataclass
class ChargeReport:
    """What one run did: new charges, reconciled stale claims, failures left claimed."""

    charged: int = 0
    reconciled: int = 0
    failed: int = 0


async def charge_due_subscriptions(
    session: AsyncSession,
    payments: PaymentProvider,
    now: datetime,
    cooldown: timedelta,
    fence: Callable[[AsyncSession], Awaitable[None]] | None = None,
) -> ChargeReport:
    """Charge every due subscription once, reconciling stale claims; see the module doc.

    ``fence`` (the job's ``ctx.fence``) runs inside each claim's transaction; what it
    raises (LeadershipLostError) ends the pass with that claim rolled back.
    """
    report = ChargeReport()
    skip: list[int] = []
    while True:
        async with session.begin():
            row = (
                await session.execute(
                    _NEXT, {"now": now, "stale_before": now - cooldown, "skip": skip}
                )
            ).first()
            if row is None:
                return report
            if row.pending_charge_ref is not None:
                reference, amount, stale = (
                    str(row.pending_charge_ref),
                    row.pending_amount_cents,
                    True,
                )
                await session.execute(_RENEW_CLAIM, {"id": row.id, "now": now})
            else:
                reference, amount, stale = str(uuid.uuid4()), row.amount_cents, False
                await session.execute(_CLAIM, {"id": row.id, "reference": reference, "now": now})
            if fence is not None:
                await fence(session)
        try:
            if stale:
                result = await payments.lookup(reference)
            else:
                result = await payments.charge(reference, amount)
        except Exception:
            # The claim stays: after the cooldown the reference is reconciled, not re-sent.
            logger.warning("charge %s of subscription %s failed", reference, row.id, exc_info=True)
            report.failed += 1
            skip.append(row.id)
            continue
        await _settle(session, row.id, reference, amount, result, now)
        if stale:
            report.reconciled += 1
        else:
            report.charged += 1


async def _settle(
    session: AsyncSession,
    subscription_id: int,
    reference: str,
    amount: int,
    result: ChargeResult,
    now: datetime,
) -> None:
    status = {"succeeded": "succeeded", "failed": "failed", "unknown": "not_charged"}[result.status]
    async with session.begin():
        await session.execute(
            _RECORD,
            {
                "id": subscription_id,
                "reference": reference,
                "amount": amount,
                "status": status,
                "charge_id": result.charge_id,
                "now": now,
            },
        )
        await session.execute(_CLEAR, {"id": subscription_id, "reference": reference})


def register(scheduler: Scheduler, payments: PaymentProvider, cooldown_seconds: float) -> None:
    """Every 15 minutes: "Charge due subscriptions"."""
    cooldown = timedelta(seconds=cooldown_seconds)

    @scheduler.job(every(minutes=15), id="subscription_charges", name="Charge due subscriptions")
    async def subscription_charges(ctx: JobContext) -> None:
        report = await charge_due_subscriptions(
            ctx.session, payments, ctx.clock.now(), cooldown, fence=ctx.fence
        )
        if report.charged or report.reconciled or report.failed:
            ctx.log.info(
                "charged %s, reconciled %s, failed %s",
                report.charged,
                report.reconciled,
                report.failed,
            )
