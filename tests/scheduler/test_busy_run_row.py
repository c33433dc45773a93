"""A busy row delays nothing else, a run's row too: the history row of a job's run whose
owner died, held by another transaction (a report script, an operator's psql session
left open on ``SELECT ... FOR UPDATE``) with PostgreSQL's defaults (no lock_timeout),
holds up no other job's claim, and the leader keeps ticking (its heartbeat fresh): the
reap skips that row, and the job waits, shown busy, until it is free."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.supervisor import Supervisor

from .conftest import StartScheduler, lease_elsewhere, runs, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SLOT = T0 + timedelta(minutes=1)


async def _noop(ctx: JobContext) -> None:
    return None


async def _start_with_a_dead_owners_run(
    start_scheduler: StartScheduler, engine: AsyncEngine, clock: FakeClock
) -> Supervisor:
    """A leader of "dead-owner" and "other" (every minute); run 999999 of "dead-owner"
    was started by a process that died, and its running lease ran out."""
    scheduler = Scheduler()
    for job_id in ("dead-owner", "other"):
        scheduler.job(every(minutes=1), id=job_id)(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    ran_out = (T0 - timedelta(seconds=1)).isoformat()
    await lease_elsewhere(engine, "dead-owner", f"CAST('{ran_out}' AS timestamptz)")
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_runs (id, schedule, job_id, scope, slot, manual,"
                " started_at, status, lateness_ms, pid, host) VALUES (999999, 'default',"
                " 'dead-owner', 'leader', :at, false, :at, 'running', 0, 999999, 'elsewhere')"
            ),
            {"at": T0 - timedelta(minutes=1)},
        )
    return supervisor


async def test_a_held_run_row_of_a_dead_owner_delays_no_other_jobs_claim(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    await _start_with_a_dead_owners_run(start_scheduler, engine, clock)
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


async def test_a_job_whose_dead_run_row_was_held_fires_once_that_row_is_free(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    supervisor = await _start_with_a_dead_owners_run(start_scheduler, engine, clock)
    async with engine.connect() as holder:
        await holder.execute(text("SELECT 1 FROM scheduler_runs WHERE id = 999999 FOR UPDATE"))
        await clock.wait_for_sleepers(2)
        clock.set(SLOT)
        # The wake that met the held run row is over once the other job of the slot ran;
        # the dead run's row was left as it was, and no run of the job started over it.
        await wait_for_runs(engine, "other", 1)
        await clock.wait_for_sleepers(2)
        assert await runs(engine, "dead-owner") == [("running", T0 - timedelta(minutes=1))]
        await holder.rollback()
    # Tried again within a tick: the dead run is reaped, and the slot runs (runs are
    # listed by id: the dead one's, 999999, comes last).
    clock.advance(supervisor.config.leader_tick_seconds)
    assert await wait_for_runs(engine, "dead-owner", 2) == [
        ("ok", SLOT),
        ("abandoned", T0 - timedelta(minutes=1)),
    ]
