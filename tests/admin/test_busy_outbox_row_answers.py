"""What the operator reads says what is happening when a row is busy: an outbox row
that another transaction holds (an operator's psql session left open on
``SELECT ... FOR UPDATE``, a stuck script), with PostgreSQL's defaults (no
lock_timeout), makes a reset through the admin API or the CLI answer, as job writes do
(409, or exit 1, once the row stays locked), naming the backend that holds it, instead
of leaving the request waiting for as long as the row is held."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import psycopg
from sqlalchemy import text

from app.db import Database
from app.scheduler import JobContext, Scheduler, every

from .conftest import AUTH, Serve

# An operator's write waits at most 10 s for a locked row before it answers 409
# (rowlocks.patient_write's lock_timeout), and a little more for the round trips; the
# CLI's process is given more for its start-up on a loaded machine.
_ANSWER_WITHIN = 15

_STUCK = """
    INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,
        created_at, updated_at, last_error)
    VALUES ('grants', 'k1', '{}', 'stuck', 24, now(), now(), now(), 'HTTP 400')
    RETURNING id
    """


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_reset_of_an_outbox_row_held_elsewhere_answers_instead_of_waiting(
    serve: Serve, database: Database
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(_noop)
    async with database.engine.begin() as conn:
        row = (await conn.execute(text(_STUCK))).scalar_one()
    async with serve(scheduler) as client, database.engine.connect() as holder:
        held_by = (await holder.execute(text("SELECT pg_backend_pid()"))).scalar_one()
        await holder.execute(
            text("SELECT 1 FROM outbox_messages WHERE id = :id FOR UPDATE"), {"id": row}
        )
        request = asyncio.ensure_future(
            client.post(f"/admin/api/outboxes/grants/messages/{row}/reset", headers=AUTH)
        )
        done, _ = await asyncio.wait({request}, timeout=_ANSWER_WITHIN)
        await holder.rollback()
        answered = request in done
        response = await request
    assert answered, (
        f"the reset did not answer within {_ANSWER_WITHIN} s while the row was held; it "
        f"answered {response.status_code} only once the holder let go"
    )
    assert response.status_code == 409, response.text
    detail = response.json()["detail"]
    assert "held by another transaction" in detail and f"backend pid {held_by}" in detail, detail


def test_a_cli_reset_of_an_outbox_row_held_elsewhere_exits_naming_the_holder(
    database_url: str,
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(_STUCK).fetchone()
    assert row is not None
    with psycopg.connect(database_url) as holder:
        held_by = holder.execute("SELECT pg_backend_pid()").fetchone()
        holder.execute("SELECT 1 FROM outbox_messages WHERE id = %s FOR UPDATE", (row[0],))
        try:
            result = subprocess.run(
                [sys.executable, "-m", "app", "outbox", "reset", "grants", str(row[0])],
                env={**os.environ, "DATABASE_URL": database_url},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        finally:
            holder.rollback()
    assert held_by is not None
    assert result.returncode == 1, result.stderr
    [line] = result.stderr.splitlines()
    assert "held by another transaction" in line and f"backend pid {held_by[0]}" in line, line
