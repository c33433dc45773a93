"""Delivered outbox rows: kept OUTBOX_DELIVERED_DAYS on the database's clock; pending
and stuck rows are never deleted by retention, whatever their age."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.retention import RetentionPolicy, prune

from .conftest import DAY, History

POLICY = RetentionPolicy(run_history_days=30, run_history_keep=3, outbox_delivered_days=7)


async def test_a_row_delivered_before_the_days_goes_and_a_later_one_stays(
    history: History, session: AsyncSession
) -> None:
    younger = await history.message("mails", "a", age=7 * DAY - 60)
    older = await history.message("mails", "b", age=7 * DAY + 60)
    report = await prune(session, "default", POLICY)
    assert report.delivered == {"mails": 1}
    left = await history.message_ids()
    assert younger in left and older not in left


async def test_pending_and_stuck_rows_stay_whatever_their_age(
    history: History, session: AsyncSession
) -> None:
    pending = await history.message("mails", "p", age=365 * DAY, status="pending")
    stuck = await history.message("mails", "s", age=365 * DAY, status="stuck")
    await prune(session, "default", POLICY)
    assert await history.message_ids() == {pending, stuck}


async def test_an_outbox_of_another_schedule_is_left_alone(
    history: History, session: AsyncSession
) -> None:
    theirs = await history.message("mails", "a", age=30 * DAY)
    # The outbox's name belongs to "default" (History.message): another schedule's
    # prune does not see it.
    report = await prune(session, "billing", POLICY)
    assert report.delivered == {}
    assert theirs in await history.message_ids()
