"""A promotion registers every leader job in one set-based statement, not one round
trip per job; a job whose row that statement cannot write is isolated and marked broken,
and every other job still registers and fires."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, Interval, JobContext, Scheduler, every
from app.scheduler.store import JobStore, LeaderRow

from .conftest import StartScheduler, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)


async def _noop(ctx: JobContext) -> None:
    return None


@pytest.fixture
def job_upserts(engine: AsyncEngine) -> Iterator[list[str]]:
    """The statements that write scheduler_jobs rows, as the engine sends them."""
    seen: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "INSERT INTO scheduler_jobs" in statement:
            seen.append(statement)

    event.listen(engine.sync_engine, "before_cursor_execute", record)
    yield seen
    event.remove(engine.sync_engine, "before_cursor_execute", record)


async def test_a_promotion_registers_every_leader_job_in_one_statement(
    start_scheduler: StartScheduler, engine: AsyncEngine, job_upserts: list[str]
) -> None:
    scheduler = Scheduler()
    for index in range(50):
        scheduler.job(every(minutes=1 + index), id=f"job-{index}")(_noop)
    supervisor = await start_scheduler(scheduler, clock=FakeClock(T0))
    await supervisor.wait_until_firing()
    assert len(job_upserts) == 1
    async with engine.connect() as conn:
        stored = (await conn.execute(text("SELECT count(*) FROM scheduler_jobs"))).scalar_one()
    assert stored == 50


async def test_a_promotion_keeps_each_stored_slot_and_resets_a_changed_trigger(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at) VALUES"
                " ('kept', 'kept', :kept, :later), ('changed', 'changed', 'every 1h', :later)"
            ),
            {"kept": every(minutes=1).describe(), "later": T0 + timedelta(hours=5)},
        )
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="kept")(_noop)
    scheduler.job(every(minutes=1), id="changed")(_noop)
    supervisor = await start_scheduler(scheduler, clock=FakeClock(T0))
    await supervisor.wait_until_firing()
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT id, next_run_at FROM scheduler_jobs"))
        rows = {row.id: row.next_run_at for row in result}
    assert rows == {"kept": T0 + timedelta(hours=5), "changed": T0 + timedelta(minutes=1)}


async def test_a_row_the_set_registration_cannot_write_is_broken_and_the_rest_fire(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "CREATE FUNCTION refuse_poisoned() RETURNS trigger LANGUAGE plpgsql AS $$"
                " BEGIN RAISE EXCEPTION 'this row cannot be written'; END $$"
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_poisoned BEFORE INSERT ON scheduler_jobs FOR EACH ROW"
                " WHEN (NEW.id = 'poisoned') EXECUTE FUNCTION refuse_poisoned()"
            )
        )
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="good")(_noop)
    scheduler.job(every(minutes=1), id="poisoned")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(60)
    assert await wait_for_runs(engine, "good", 1) == [("ok", T0 + timedelta(minutes=1))]
    async with engine.connect() as conn:
        result = await conn.execute(text("SELECT job_id, error FROM scheduler_broken_jobs"))
        broken = {row.job_id: row.error for row in result}
    assert list(broken) == ["poisoned"]
    assert "this row cannot be written" in broken["poisoned"]


class _CountedInterval(Interval):
    """An interval that counts how often a first slot is computed (cron's is costly)."""

    computed: ClassVar[list[str]] = []

    def first_slot(self, now: datetime, zone: ZoneInfo) -> datetime:
        self.computed.append(self.describe())
        return super().first_slot(now, zone)


async def test_a_promotion_computes_no_first_slot_for_a_stored_unchanged_job(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    stored, added = _CountedInterval(timedelta(minutes=1)), _CountedInterval(timedelta(hours=1))
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
                " VALUES ('stored', 'stored', :trigger, :later)"
            ),
            {"trigger": stored.describe(), "later": T0 + timedelta(hours=5)},
        )
    _CountedInterval.computed.clear()
    scheduler = Scheduler()
    scheduler.job(stored, id="stored")(_noop)
    scheduler.job(added, id="added")(_noop)
    supervisor = await start_scheduler(scheduler, clock=FakeClock(T0))
    await supervisor.wait_until_firing()
    assert _CountedInterval.computed == [added.describe()]


async def test_a_row_given_without_slots_whose_job_has_no_row_is_left_out(
    engine: AsyncEngine,
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="vanished")(_noop)
    spec = scheduler.jobs["vanished"]
    # Read as stored with this trigger, then deleted before the upsert ran.
    row = LeaderRow.of(spec, T0, ZoneInfo("UTC"), stored_trigger=spec.trigger.describe())
    store = JobStore(engine, pid=1, host="test")
    assert await store.upsert_leader_rows([row]) == {}
    async with engine.connect() as conn:
        count = (await conn.execute(text("SELECT count(*) FROM scheduler_jobs"))).scalar_one()
    assert count == 0


async def test_a_registration_on_a_fresh_connection_sends_no_type_introspection(
    engine: AsyncEngine,
) -> None:
    # asyncpg looks up every array type but text[] in pg_type once per connection, a
    # query that costs a new backend tens of milliseconds: a promotion registers its
    # jobs on the standby's pooled connections, which have never run that statement.
    sent: list[str] = []

    def attach(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        dbapi_connection.driver_connection.add_query_logger(lambda query: sent.append(query.query))

    await engine.dispose()
    event.listen(engine.sync_engine.pool, "checkout", attach)
    try:
        scheduler = Scheduler()
        scheduler.job(every(minutes=1), id="fresh")(_noop)
        row = LeaderRow.of(scheduler.jobs["fresh"], T0, ZoneInfo("UTC"), stored_trigger=None)
        registered = await JobStore(engine, pid=1, host="test").upsert_leader_rows([row])
    finally:
        event.remove(engine.sync_engine.pool, "checkout", attach)
        await engine.dispose()
    assert registered["fresh"].next_run_at == T0 + timedelta(minutes=1)
    assert [query for query in sent if "pg_type" in query] == []
