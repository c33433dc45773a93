"""10,000 leader jobs: a leader's tick and promotion do work for what changed, not for
every job. The tick reloaded every job row to find what other processes changed (a
pause, a resume, a run-now request), and a failover rewrote every stored row: with
10,000 jobs each tick stalled the loop for a quarter of a second and a failover took
longer than a first boot. What another process changes is still seen within a tick
(test_operator_writes_seen.py)."""

from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import JobRowTraffic, StartScheduler, eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MANY = 10_000


async def _noop(ctx: JobContext) -> None:
    return None


def _hourly_jobs(count: int) -> Scheduler:
    scheduler = Scheduler()
    for index in range(count):
        scheduler.job(every(hours=1), id=f"job-{index:05d}")(_noop)
    return scheduler


async def test_a_tick_over_ten_thousand_unchanged_jobs_reads_no_job_row(
    start_scheduler: StartScheduler, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    supervisor = await start_scheduler(_hourly_jobs(MANY), clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    job_row_traffic.clear()
    clock.advance(supervisor.config.leader_tick_seconds)
    await job_row_traffic.heartbeat.wait()
    assert job_row_traffic.read == 0


async def test_a_failover_over_ten_thousand_unchanged_stored_jobs_writes_no_job_row(
    start_scheduler: StartScheduler, engine: AsyncEngine, job_row_traffic: JobRowTraffic
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
                " SELECT 'job-' || lpad(n::text, 5, '0'), 'job-' || lpad(n::text, 5, '0'),"
                " :trigger, :later FROM generate_series(0, :last) AS n"
            ),
            {
                "trigger": every(hours=1).describe(),
                "later": T0 + timedelta(hours=1),
                "last": MANY - 1,
            },
        )
    job_row_traffic.clear()
    supervisor = await start_scheduler(_hourly_jobs(MANY), clock=FakeClock(T0))
    await supervisor.wait_until_firing()
    assert job_row_traffic.written == 0


async def test_a_first_boot_that_registers_ten_thousand_jobs_has_the_planner_count_them(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    # Planned for the empty table it was, the slot claim read every job row at each
    # fire until the autovacuum's analyze, up to a minute after the first boot.
    supervisor = await start_scheduler(_hourly_jobs(MANY), clock=FakeClock(T0))
    await supervisor.wait_until_firing()

    async def counted() -> bool:
        async with engine.connect() as conn:
            planned: float = (
                await conn.execute(
                    text("SELECT reltuples FROM pg_class WHERE oid = 'scheduler_jobs'::regclass")
                )
            ).scalar_one()
        return planned >= MANY

    await eventually(counted, what="the planner's count of the job rows")
