"""A busy row delays nothing else, a run's row too: the history row of a job's run whose
owner died, held by another transaction (a report script, an operator's psql session
left open on ``SELECT ... FOR UPDATE``) with PostgreSQL's defaults (no lock_timeout),
holds up no other job's claim, and the leader keeps ticking (its heartbeat fresh) while
the reap of that run waits for its row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import StartScheduler, lease_elsewhere, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SLOT = T0 + timedelta(minutes=1)


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_held_run_row_of_a_dead_owner_delays_no_other_jobs_claim(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    for job_id in ("dead-owner", "other"):
        scheduler.job(every(minutes=1), id=job_id)(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    # Run 999999 of "dead-owner" was started by a process that died; its lease ran out.
    ran_out = (T0 - timedelta(seconds=1)).isoformat()
    await lease_elsewhere(engine, "dead-owner", f"CAST('{ran_out}' AS timestamptz)")
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_runs (id, schedule, job_id, scope, slot, manual,"
                " started_at, status, lateness_ms, pid, host) VALUES (999999, 'default', 'dead-owner',"
                " 'leader', :at, false, :at, 'running', 0, 999999, 'elsewhere')"
            ),
            {"at": T0 - timedelta(minutes=1)},
        )
    async with engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM scheduler_runs WHERE id = 999999 FOR UPDATE"))
        await clock.wait_for_sleepers(2)
        clock.set(SLOT)
        try:
            other = await wait_for_runs(engine, "other", 1)
        except AssertionError as timed_out:
            raise AssertionError(
                f"{timed_out}; waiting on a lock: {await _waiting(engine)}"
            ) from None
        finally:
            await holder.rollback()
    assert other == [("ok", SLOT)]


async def _waiting(engine: AsyncEngine) -> list[str]:
    """The statements that wait on a lock, abridged."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 60) FROM pg_stat_activity"
                " WHERE wait_event_type = 'Lock'"
            )
        )
        return [row[0] for row in rows]
