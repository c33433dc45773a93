"""What the operator reads says what is happening when a row is busy: an outbox row
that another transaction holds (an operator's psql session left open on
``SELECT ... FOR UPDATE``, a stuck script), with PostgreSQL's defaults (no
lock_timeout), makes a reset through the admin API answer, as job writes do (409 once
the row stays locked), instead of leaving the request waiting for as long as the row is
held."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from app.db import Database
from app.scheduler import JobContext, Scheduler, every

from .conftest import AUTH, Serve

# A job write waits at most this long for a locked row before it answers 409
# (queries._PATIENT_WRITE's lock_timeout), and a little more for the round trips.
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
