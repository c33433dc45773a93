"""A run whose running lease still holds is never pruned, whatever its recorded status:
a thread body past its timeout has its outcome ('timeout') recorded while it runs on
and renews its lease on its run row. Deleting that row would lose the lease (the
renewal finds no row: "lost its running lease ... another leader may start it") and
let the job start again beside the body that still runs."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import Database
from app.retention import RetentionPolicy, prune

from .conftest import DAY, History

POLICY = RetentionPolicy(run_history_days=30, run_history_keep=1, outbox_delivered_days=7)

# The outcome of a thread past its timeout: recorded, its lease kept (finish_steps with
# body_ended False), and renewed on the run row for the hour to come.
_LEASE_HELD = text(
    """
    WITH run AS (
        UPDATE scheduler_runs SET scope = :scope, running_until = now() + interval '1 hour'
        WHERE id = :run_id RETURNING id, job_id
    )
    UPDATE scheduler_jobs j
    SET running_run_id = run.id, running_since = now() - interval '90 days',
        running_until = now() + interval '1 hour', running_pid = 1, running_host = 'h'
    FROM run WHERE :scope = 'leader' AND j.schedule = 'default' AND j.id = run.job_id
    """
)


@pytest.mark.parametrize("scope", ["leader", "replica"])
async def test_a_run_whose_running_lease_holds_is_never_pruned_whatever_its_status(
    database: Database, history: History, session: AsyncSession, scope: str
) -> None:
    hung = await history.run("slow", age=90 * DAY, status="timeout")
    async with database.engine.begin() as conn:
        await conn.execute(_LEASE_HELD, {"run_id": hung, "scope": scope})
    # Slots that came while it ran, recorded newer than it and as old as the days:
    # keep=1 keeps one of them, and the others go.
    newer = {
        await history.run("slow", age=80 * DAY - n, status="skipped_overlap") for n in range(3)
    }
    await prune(session, "default", POLICY)
    assert hung in await history.run_ids("slow")
    assert len((await history.run_ids("slow")) & newer) == 1
