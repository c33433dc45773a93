"""Booking reminders (stamp column) and standing orders (advance then commit): each run
twice, and at once, with one effect."""

import asyncio
from datetime import date, timedelta

import pytest
from sqlalchemy import text

from app.db import Database
from app.jobs.booking_reminders import send_due_reminders
from app.jobs.standing_orders import generate_due_entries
from app.scheduler import LeadershipLostError

from ..conftest import promote_elsewhere
from .conftest import NOW, FakeSms, thread_run_context


async def _booking(database: Database, workspace: int, phone: str, starts_in: timedelta) -> int:
    async with database.engine.begin() as conn:
        result = await conn.execute(
            text(
                "INSERT INTO bookings (workspace_id, phone, starts_at)"
                " VALUES (:w, :phone, :starts) RETURNING id"
            ),
            {"w": workspace, "phone": phone, "starts": NOW + starts_in},
        )
        return int(result.scalar_one())


async def test_two_reminder_runs_send_one_sms_per_booking_and_window(
    database: Database, workspace: int
) -> None:
    await _booking(database, workspace, "+41790000001", timedelta(minutes=30))
    await _booking(database, workspace, "+41790000002", timedelta(hours=5))
    await _booking(database, workspace, "+41790000003", timedelta(days=3))
    sms = FakeSms()
    for _ in range(2):
        async with database.sessions() as session:
            await send_due_reminders(session, sms, NOW)
    # The 30-minute booking is in the 1 h window, the 5-hour one in the 24 h window.
    assert sorted((phone, "1h" in text) for phone, text in sms.sent) == [
        ("+41790000001", True),
        ("+41790000002", False),
    ]


async def test_two_processes_at_once_send_one_sms_per_booking(
    database: Database, workspace: int
) -> None:
    for n in range(20):
        await _booking(database, workspace, f"+4179{n:07d}", timedelta(hours=5))
    sms = FakeSms()

    async def run() -> None:
        async with database.sessions() as session:
            await send_due_reminders(session, sms, NOW)

    await asyncio.gather(run(), run(), run())
    assert len(sms.sent) == 20
    assert len({phone for phone, _ in sms.sent}) == 20


async def test_failed_sms_leaves_the_booking_for_the_next_run(
    database: Database, workspace: int
) -> None:
    booking = await _booking(database, workspace, "+41790000009", timedelta(hours=5))
    await _booking(database, workspace, "+41790000010", timedelta(hours=5))
    sms = FakeSms()
    sms.fail_for.add("+41790000009")
    async with database.sessions() as session:
        assert await send_due_reminders(session, sms, NOW) == 1
    async with database.engine.connect() as conn:
        stamp = await conn.execute(
            text("SELECT reminder_24h_sent_at FROM bookings WHERE id = :id"), {"id": booking}
        )
        assert stamp.scalar_one() is None
    sms.fail_for.clear()
    async with database.sessions() as session:
        assert await send_due_reminders(session, sms, NOW) == 1


async def _template(database: Database, workspace: int, due: date) -> int:
    async with database.engine.begin() as conn:
        result = await conn.execute(
            text(
                "INSERT INTO standing_order_templates"
                " (workspace_id, description, amount_cents, next_due_date)"
                " VALUES (:w, 'Rent', 250000, :due) RETURNING id"
            ),
            {"w": workspace, "due": due},
        )
        return int(result.scalar_one())


async def test_seed_check_8_two_runs_in_one_minute_post_one_entry(
    database: Database, workspace: int
) -> None:
    template = await _template(database, workspace, date(2026, 3, 2))

    def run() -> int:
        with database.sync_sessions() as session:
            return generate_due_entries(session, date(2026, 3, 2))

    assert await asyncio.to_thread(run) == 1
    assert await asyncio.to_thread(run) == 0
    async with database.engine.connect() as conn:
        entries = await conn.execute(text("SELECT count(*) FROM journal_entries"))
        assert entries.scalar_one() == 1
        due = await conn.execute(
            text("SELECT next_due_date FROM standing_order_templates WHERE id = :id"),
            {"id": template},
        )
        assert due.scalar_one() == date(2026, 4, 2)


async def test_standing_orders_from_three_threads_at_once_post_once(
    database: Database, workspace: int
) -> None:
    for _ in range(10):
        await _template(database, workspace, date(2026, 3, 1))

    def run() -> int:
        with database.sync_sessions() as session:
            return generate_due_entries(session, date(2026, 3, 2))

    posted = await asyncio.gather(*(asyncio.to_thread(run) for _ in range(3)))
    assert sum(posted) == 10


async def test_a_run_whose_leadership_was_superseded_posts_no_standing_order_entry(
    database: Database, database_url: str, workspace: int
) -> None:
    for _ in range(2):
        await _template(database, workspace, date(2026, 3, 1))
    term = await promote_elsewhere(database_url)
    stale = thread_run_context(database, "standing_orders", term=term)
    await promote_elsewhere(database_url)

    def run() -> int:
        with database.sync_sessions() as session:
            return generate_due_entries(session, date(2026, 3, 2), fence=stale.fence_sync)

    # Not one template's failure among others: the whole run ends.
    with pytest.raises(LeadershipLostError):
        await asyncio.to_thread(run)
    async with database.engine.connect() as conn:
        entries = await conn.execute(text("SELECT count(*) FROM journal_entries"))
        assert entries.scalar_one() == 0
        due = await conn.execute(
            text("SELECT DISTINCT next_due_date FROM standing_order_templates")
        )
        assert due.scalars().all() == [date(2026, 3, 1)]


async def test_a_run_of_the_current_leadership_posts_its_standing_order_entries(
    database: Database, database_url: str, workspace: int
) -> None:
    for _ in range(2):
        await _template(database, workspace, date(2026, 3, 1))
    current = thread_run_context(
        database, "standing_orders", term=await promote_elsewhere(database_url)
    )

    def run() -> int:
        with database.sync_sessions() as session:
            return generate_due_entries(session, date(2026, 3, 2), fence=current.fence_sync)

    assert await asyncio.to_thread(run) == 2
