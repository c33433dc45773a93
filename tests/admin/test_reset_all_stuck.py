"""Every stuck row of an outbox is reset in one statement (CLI, API, page), which
answers how many it reset and leaves a row another transaction holds alone, counted,
without waiting for it."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from app.db import Database

from .conftest import AUTH, Worker, app_command, signed_in, stuck_row


async def _statuses(database: Database) -> dict[int, str]:
    async with database.engine.connect() as conn:
        rows = await conn.execute(text("SELECT id, status FROM outbox_messages ORDER BY id"))
        return {row.id: row.status for row in rows}


async def test_reset_all_stuck_makes_every_stuck_row_of_the_outbox_pending_and_counts_them(
    database: Database, database_url: str
) -> None:
    for message_id in (1, 2, 3):
        await stuck_row(database, message_id)
    await stuck_row(database, 4, outbox="mail")
    result = await asyncio.to_thread(
        app_command, database_url, "outbox", "reset", "grants", "--all-stuck"
    )
    assert result.returncode == 0, result.stderr
    assert "3 stuck message(s) of outbox 'grants' are pending again" in result.stdout
    assert await _statuses(database) == {1: "pending", 2: "pending", 3: "pending", 4: "stuck"}


async def test_reset_all_stuck_leaves_a_held_row_alone_and_counts_it_without_waiting(
    database: Database, worker: Worker
) -> None:
    for message_id in (1, 2):
        await stuck_row(database, message_id)
    async with database.engine.connect() as holder, worker() as client:
        await holder.execute(text("SELECT 1 FROM outbox_messages WHERE id = 2 FOR UPDATE"))
        # No lock_timeout is set: waiting on row 2 would hang past this bound.
        async with asyncio.timeout(10):
            response = await client.post("/admin/api/outboxes/grants/reset-stuck", headers=AUTH)
        await holder.rollback()
    assert response.status_code == 200, response.text
    assert response.json() == {"reset": 1, "held": 1}
    assert await _statuses(database) == {1: "pending", 2: "stuck"}


async def test_reset_all_stuck_of_an_unknown_outbox_is_404_naming_it(worker: Worker) -> None:
    async with worker() as client:
        response = await client.post("/admin/api/outboxes/nope/reset-stuck", headers=AUTH)
    assert response.status_code == 404
    assert "no outbox named 'nope'" in response.json()["detail"]


async def test_the_page_resets_every_stuck_row_of_an_outbox_with_its_csrf_and_says_how_many(
    database: Database, worker: Worker
) -> None:
    for message_id in (1, 2):
        await stuck_row(database, message_id)
    async with worker() as client:
        base, csrf = await signed_in(client)
        page = (await client.get(f"{base}/")).text
        assert f'action="{base}/outboxes/grants/reset-stuck"' in page
        refused = await client.post(f"{base}/outboxes/grants/reset-stuck", data={"csrf": "x"})
        assert refused.status_code == 403
        assert set((await _statuses(database)).values()) == {"stuck"}
        answer = await client.post(
            f"{base}/outboxes/grants/reset-stuck", data={"csrf": csrf}, follow_redirects=True
        )
    assert answer.status_code == 200
    assert "2 stuck message(s) of outbox grants are pending again" in answer.text
    assert await _statuses(database) == {1: "pending", 2: "pending"}


async def test_reset_needs_a_message_id_or_all_stuck_and_not_both(database_url: str) -> None:
    neither = await asyncio.to_thread(app_command, database_url, "outbox", "reset", "grants")
    both = await asyncio.to_thread(
        app_command, database_url, "outbox", "reset", "grants", "1", "--all-stuck"
    )
    for result in (neither, both):
        assert result.returncode == 2
        assert "a message ID or --all-stuck" in result.stderr
