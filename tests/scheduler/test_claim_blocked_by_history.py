"""A claim is never blocked by its history row, whatever the clocks say.

A slot recorded by one worker can come due again on another: a trigger change resets
the countdown to the next slot after the new leader's "now", and a leader whose clock
is behind the previous one's (two hosts, here 2 minutes apart) lands on the slot the
previous leader already ran. With misfire_grace the claim then records the passed-over
slot (the one already in the history) as 'missed' in every attempt: the unique index on
(job, slot) refuses that row, the claim rolls back, and the job never moves again.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, cron

from .conftest import StartScheduler, eventually, wait_for_runs

SLOT = datetime(2026, 1, 1, 10, 0, tzinfo=UTC)


async def _noop(ctx: JobContext) -> None:
    return None


def _hourly(expression: str) -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(cron(expression, tz="UTC"), id="report", misfire_grace=600)(_noop)
    return scheduler


async def test_a_job_keeps_moving_when_its_due_slot_is_already_in_the_history(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock_a = FakeClock(SLOT - timedelta(minutes=1))
    old = _hourly("0 * * * *")
    a = await start_scheduler(old, clock=clock_a)
    await a.wait_until_firing()
    await clock_a.wait_for_sleepers(2)
    clock_a.set(SLOT)
    await wait_for_runs(engine, "report", 1)
    await old.stop()
    # The new version (every two hours) is deployed on a host 2 minutes behind.
    clock_b = FakeClock(SLOT - timedelta(minutes=2))
    b = await start_scheduler(_hourly("0 */2 * * *"), clock=clock_b)
    await b.wait_until_firing()
    await clock_b.wait_for_sleepers(2)
    # B's clock reaches the slot A ran, then the next two slots of the new trigger.
    clock_b.set(SLOT + timedelta(hours=4, seconds=1))

    async def moved_past_the_ran_slot() -> bool:
        async with engine.connect() as conn:
            next_run_at = (
                await conn.execute(
                    text("SELECT next_run_at FROM scheduler_jobs WHERE id = 'report'")
                )
            ).scalar_one()
        return bool(next_run_at > SLOT + timedelta(hours=4))

    await eventually(moved_past_the_ran_slot, 5, "the job to move past the slot A ran")
