"""The shipped test kit works the way the README tells a user to use it."""

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.outbox import Outbox
from app.scheduler import JobContext, Role, Scheduler, SchedulerConfig, SchedulerError, every
from app.testing import RecordingReceiver, drain, run_job, terminate_leader_connection

from .conftest import promote_elsewhere

AT = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)


@pytest.fixture
def scheduler() -> Scheduler:
    scheduler = Scheduler()

    @scheduler.job(every(hours=1), id="writes")
    async def writes(ctx: JobContext) -> None:
        await ctx.session.execute(
            text("CREATE TABLE IF NOT EXISTS kit_notes (slot timestamptz PRIMARY KEY)")
        )
        await ctx.session.execute(
            text("INSERT INTO kit_notes VALUES (:slot)"), {"slot": ctx.scheduled_at}
        )

    @scheduler.job(every(hours=1), id="fenced")
    async def fenced(ctx: JobContext) -> None:
        await ctx.session.execute(
            text("CREATE TABLE IF NOT EXISTS kit_notes (slot timestamptz PRIMARY KEY)")
        )
        await ctx.fence(ctx.session)
        await ctx.session.execute(
            text("INSERT INTO kit_notes VALUES (:slot)"), {"slot": ctx.scheduled_at}
        )

    @scheduler.job(every(hours=1), id="raises")
    def raises(ctx: JobContext) -> None:
        raise RuntimeError("the gateway said no")

    @scheduler.job(every(minutes=5), id="sweep", leader_only=False)
    async def sweep(ctx: JobContext) -> None:
        return None

    return scheduler


async def test_run_job_fires_one_slot_and_returns_its_record(
    scheduler: Scheduler, regent_database: Database
) -> None:
    record = await run_job(scheduler, "writes", database=regent_database, at=AT)
    assert (record.status, record.slot, record.error) == ("ok", AT, None)
    assert record.duration_ms is not None and record.finished_at is not None
    async with regent_database.engine.connect() as conn:
        slots = (await conn.execute(text("SELECT slot FROM kit_notes"))).scalars().all()
    assert slots == [AT]


@pytest.mark.parametrize("promotions", [0, 2], ids=["no-leader-ever", "after-promotions"])
async def test_run_job_passes_the_fence(
    scheduler: Scheduler, regent_database: Database, regent_database_url: str, promotions: int
) -> None:
    for _ in range(promotions):
        await promote_elsewhere(regent_database_url)
    record = await run_job(scheduler, "fenced", database=regent_database, at=AT)
    assert (record.status, record.error) == ("ok", None)
    async with regent_database.engine.connect() as conn:
        slots = (await conn.execute(text("SELECT slot FROM kit_notes"))).scalars().all()
    assert slots == [AT]


async def test_run_job_runs_as_run_now_does_and_leaves_the_schedule_alone(
    scheduler: Scheduler, regent_database: Database
) -> None:
    first = await run_job(scheduler, "writes", database=regent_database, at=AT)
    second = await run_job(
        scheduler, "writes", database=regent_database, at=AT + timedelta(minutes=10)
    )
    assert (first.status, second.status) == ("ok", "ok")
    async with regent_database.engine.connect() as conn:
        next_run_at = (
            await conn.execute(text("SELECT next_run_at FROM scheduler_jobs WHERE id = 'writes'"))
        ).scalar_one()
        manual = (
            await conn.execute(text("SELECT manual FROM scheduler_runs ORDER BY id"))
        ).scalars()
        assert list(manual) == [True, True]
    # The slot the first registration placed, an hour after AT.
    assert next_run_at == AT + timedelta(hours=1)


async def test_run_job_reports_a_raising_body_as_an_error_record(
    scheduler: Scheduler, regent_database: Database
) -> None:
    record = await run_job(scheduler, "raises", database=regent_database, at=AT)
    assert record.status == "error"
    assert record.error is not None and "the gateway said no" in record.error


async def test_run_job_runs_a_per_worker_job(
    scheduler: Scheduler, regent_database: Database
) -> None:
    record = await run_job(scheduler, "sweep", database=regent_database, at=AT)
    assert record.status == "ok"


async def test_run_job_names_the_jobs_of_the_scheduler_for_an_unknown_id(
    scheduler: Scheduler, regent_database: Database
) -> None:
    with pytest.raises(SchedulerError, match="'writes'"):
        await run_job(scheduler, "wirtes", database=regent_database)


async def test_drain_delivers_to_a_recording_receiver(regent_database: Database) -> None:
    receiver = RecordingReceiver()
    outbox = Outbox("kit_mails", receiver)
    async with regent_database.sessions() as session:
        await outbox.enqueue(session, {"to": "ada@example.com"}, key="mail-1")
        await session.commit()
    report = await drain(outbox, database=regent_database)
    assert report.delivered == 1
    assert receiver.delivered == {"mail-1": 1}


async def test_terminating_the_leader_connection_demotes_the_leader(
    scheduler: Scheduler, regent_database: Database, regent_database_url: str
) -> None:
    config = SchedulerConfig(
        lock_dsn=asyncpg_dsn(regent_database_url),
        lease_seconds=6,
        leader_tick_seconds=1,
        handover_grace_seconds=0,
    )
    roles: list[str] = []
    promoted_again = asyncio.Event()

    def on_role(role: str) -> None:
        roles.append(role)
        if roles.count("leader") == 2:
            promoted_again.set()

    scheduler.observe(on_role=on_role)
    supervisor = await scheduler.start(
        config,
        engine=regent_database.engine,
        sessions=regent_database.sessions,
        sync_sessions=regent_database.sync_sessions,
    )
    try:
        await supervisor.wait_for_role(Role.LEADER)
        assert await terminate_leader_connection(regent_database.engine) == 1
        await asyncio.wait_for(promoted_again.wait(), 10)
        assert roles == ["leader", "standby", "leader"]
    finally:
        await scheduler.stop()


async def test_run_job_runs_the_job_of_the_schedule_scheduler_name_names(
    scheduler: Scheduler, regent_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDULER_NAME", "billing")
    record = await run_job(scheduler, "writes", database=regent_database, at=AT)
    async with regent_database.engine.connect() as conn:
        schedule = (
            await conn.execute(
                text("SELECT schedule FROM scheduler_runs WHERE id = :id"), {"id": record.run_id}
            )
        ).scalar_one()
    assert schedule == "billing"


async def test_run_job_runs_the_job_of_the_name_the_scheduler_is_given(
    regent_database: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SCHEDULER_NAME", "billing")
    named = Scheduler(name="reports")
    named.job(every(hours=1), id="report")(lambda ctx: None)
    record = await run_job(named, "report", database=regent_database, at=AT)
    async with regent_database.engine.connect() as conn:
        schedule = (
            await conn.execute(
                text("SELECT schedule FROM scheduler_runs WHERE id = :id"), {"id": record.run_id}
            )
        ).scalar_one()
    assert schedule == "reports"
