"""Subscription charging (claim before send, with a reference) and the stale
reservation sweep: no card charged twice, no reservation refunded twice."""

import asyncio
from datetime import datetime, timedelta

import pytest
from sqlalchemy import text

from app.db import Database
from app.jobs.gateways import ChargeResult
from app.jobs.reservations import refund_stale_reservations
from app.jobs.subscriptions import ChargeReport, charge_due_subscriptions, register
from app.scheduler import Scheduler
from app.testing import run_job

from ..conftest import promote_elsewhere
from .conftest import NOW, Crash, FakePayments

COOLDOWN = timedelta(minutes=15)


async def _subscription(database: Database, workspace: int) -> int:
    async with database.engine.begin() as conn:
        result = await conn.execute(
            text(
                "INSERT INTO subscriptions (workspace_id, amount_cents, next_charge_at)"
                " VALUES (:w, 1900, :due) RETURNING id"
            ),
            {"w": workspace, "due": NOW - timedelta(minutes=1)},
        )
        return int(result.scalar_one())


async def _charge(database: Database, payments: FakePayments, at: datetime = NOW) -> ChargeReport:
    async with database.sessions() as session:
        return await charge_due_subscriptions(session, payments, at, COOLDOWN)


async def _charges(database: Database) -> list[tuple[str, int]]:
    async with database.engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT status, amount_cents FROM subscription_charges ORDER BY id")
        )
        return [(row.status, row.amount_cents) for row in rows]


async def test_two_runs_charge_a_due_subscription_once(database: Database, workspace: int) -> None:
    await _subscription(database, workspace)
    payments = FakePayments()
    await _charge(database, payments)
    await _charge(database, payments)
    assert len(payments.charges) == 1
    assert await _charges(database) == [("succeeded", 1900)]


async def test_three_runners_at_once_charge_once(database: Database, workspace: int) -> None:
    for _ in range(5):
        await _subscription(database, workspace)
    payments = FakePayments()
    await asyncio.gather(*(_charge(database, payments) for _ in range(3)))
    assert len(payments.calls) == 5
    assert len(payments.charges) == 5


async def test_crash_after_the_claim_before_the_provider_call_never_charges(
    database: Database, workspace: int
) -> None:
    await _subscription(database, workspace)
    payments = FakePayments()
    payments.crash_before_charge = True
    with pytest.raises(Crash):
        await _charge(database, payments)
    payments.crash_before_charge = False
    # Within the cooldown the claim is a charge in flight: left alone.
    await _charge(database, payments, NOW + timedelta(minutes=5))
    assert payments.charges == {}
    # After it, the reference is reconciled, never charged again.
    await _charge(database, payments, NOW + COOLDOWN + timedelta(minutes=1))
    assert payments.charges == {}
    assert len(payments.calls) == 1
    assert await _charges(database) == [("not_charged", 1900)]


async def test_crash_after_the_provider_charged_records_it_without_recharging(
    database: Database, workspace: int
) -> None:
    subscription = await _subscription(database, workspace)
    payments = FakePayments()
    payments.crash_after_charge = True
    with pytest.raises(Crash):
        await _charge(database, payments)
    payments.crash_after_charge = False
    await _charge(database, payments, NOW + COOLDOWN + timedelta(minutes=1))
    assert len(payments.calls) == 1
    assert len(payments.charges) == 1
    assert await _charges(database) == [("succeeded", 1900)]
    async with database.engine.connect() as conn:
        claim = await conn.execute(
            text("SELECT pending_charge_ref FROM subscriptions WHERE id = :id"),
            {"id": subscription},
        )
        assert claim.scalar_one() is None


class PaymentsDuringAPromotion(FakePayments):
    """A PSP during whose first charge a new leader promotes elsewhere."""

    def __init__(self, database_url: str) -> None:
        super().__init__()
        self.database_url = database_url

    async def charge(self, reference: str, amount_cents: int) -> ChargeResult:
        if not self.calls:
            await promote_elsewhere(self.database_url)
        return await super().charge(reference, amount_cents)


async def test_a_charge_run_whose_leadership_was_superseded_claims_no_further_subscription(
    database: Database, database_url: str, workspace: int
) -> None:
    first = await _subscription(database, workspace)
    second = await _subscription(database, workspace)
    payments = PaymentsDuringAPromotion(database_url)
    scheduler = Scheduler()
    register(scheduler, payments, COOLDOWN.total_seconds())
    record = await run_job(scheduler, "subscription_charges", database=database, at=NOW)
    assert record.status == "error"
    assert record.error is not None and "LeadershipLostError" in record.error
    # The charge made before the promotion is recorded; no card is charged after it.
    assert len(payments.charges) == 1
    assert await _charges(database) == [("succeeded", 1900)]
    async with database.engine.connect() as conn:
        claims = await conn.execute(
            text("SELECT id, pending_charge_ref, next_charge_at FROM subscriptions ORDER BY id")
        )
        rows = claims.all()
    assert [row.id for row in rows] == [first, second]
    assert (rows[1].pending_charge_ref, rows[1].next_charge_at) == (
        None,
        NOW - timedelta(minutes=1),
    )


async def _reservation(database: Database, workspace: int, age: timedelta, status: str) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO credit_reservations (workspace_id, amount, status, created_at)"
                " VALUES (:w, 100, :status, :created)"
            ),
            {"w": workspace, "status": status, "created": NOW - age},
        )


async def _balance(database: Database, workspace: int) -> int:
    async with database.engine.connect() as conn:
        result = await conn.execute(
            text("SELECT credit_balance FROM workspaces WHERE id = :id"), {"id": workspace}
        )
        return int(result.scalar_one())


async def test_two_workers_sweeping_at_once_refund_once(database: Database, workspace: int) -> None:
    for _ in range(30):
        await _reservation(database, workspace, timedelta(minutes=20), "held")
    await _reservation(database, workspace, timedelta(minutes=5), "held")

    async def sweep() -> int:
        async with database.sessions() as session:
            return await refund_stale_reservations(session, NOW)

    assert sorted(await asyncio.gather(sweep(), sweep())) == [0, 30]
    assert await _balance(database, workspace) == 3000


async def test_a_settled_reservation_matches_nothing(database: Database, workspace: int) -> None:
    await _reservation(database, workspace, timedelta(hours=1), "settled")
    async with database.sessions() as session:
        assert await refund_stale_reservations(session, NOW) == 0
    assert await _balance(database, workspace) == 0
