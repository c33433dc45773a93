"""What an operator writes with plain SQL (a run-now, a pause) is seen by the leader
within a tick, never missed. The tick reads only the job rows whose change mark
(changed_xid, set by a trigger on every update and every insert but a leader's own
registration's) is at or above its previous read's horizon; so a change is seen also
when it is

- written in a transaction under way while a tick reads and committed only after it;
- written in a session with ``session_replication_role = replica`` (the apply worker
  of logical replication, a data-fix script that sets it to skip foreign-key checks),
  where an ordinary trigger does not fire;
- written with the job row deleted and inserted again (a restore of the table, a
  script that recreates the row);
- read by a tick while the job's claim was under way, and the read that follows the
  claim fails: the tick's horizon has moved past the change by then, so the job's row
  is read again at the next tick.

That last window is real where a claim commits long before its wake ends: a wake
whose claim of several jobs failed for one job's fault claims each alone, and the jobs
claimed first stay "under way" until the last is in. Its test has the operator's
run-now of such a job commit right after its claim (it waited on the row), the tick
read it while the next job's claim waits, and the read after the claims lose its
connection."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.election import WAKE_CHANNEL

from .conftest import JobRowTraffic, StartScheduler, eventually, wait_for_runs

T0 = datetime(2026, 1, 1, tzinfo=UTC)
SLOT = T0 + timedelta(hours=1)
ASKED_AT = T0 + timedelta(minutes=30)
# The advisory lock the refused job's claim waits on once its batch claim has failed.
REFUSAL_GATE = 7_204_011

_REFUSE = f"""
CREATE SEQUENCE refusals;
CREATE FUNCTION refuse_a_refused() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- The batch claim is refused at once; the claim of the job alone waits first.
    IF nextval('refusals') > 1 THEN
        PERFORM pg_advisory_xact_lock({REFUSAL_GATE});
    END IF;
    RAISE EXCEPTION 'this row cannot be updated';
END $$;
CREATE TRIGGER refuse_a_refused BEFORE UPDATE ON scheduler_jobs FOR EACH ROW
    WHEN (OLD.id = 'a_refused') EXECUTE FUNCTION refuse_a_refused();
"""
# Held uncommitted: the claim of b_asked waits on it, its job row updated and locked.
_RUN_OF_THE_SLOT = """
INSERT INTO scheduler_runs (id, schedule, job_id, scope, slot, manual, started_at, status,
    lateness_ms, pid, host)
VALUES (nextval(pg_get_serial_sequence('scheduler_runs', 'id')), 'default', 'b_asked',
    'leader', %s, false, %s, 'running', 0, 0, 'test')
"""
_WAITING = """
SELECT pid FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE %s
"""
_GATE_WAITERS = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s"
)


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_run_now_committed_after_a_tick_began_reading_runs_by_the_next_tick(
    start_scheduler: StartScheduler,
    database_url: str,
    job_row_traffic: JobRowTraffic,
) -> None:
    # Written by another process without a wake (plain SQL), in a transaction that is
    # under way while a tick reads and commits only after: a change is not missed for
    # having been made before the tick that first could have seen it committed.
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="asked")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    async with await psycopg.AsyncConnection.connect(database_url) as other:
        await other.execute(
            "UPDATE scheduler_jobs SET run_requested_at = %s WHERE id = 'asked'", (T0,)
        )
        job_row_traffic.clear()
        clock.advance(supervisor.config.leader_tick_seconds)
        await job_row_traffic.heartbeat.wait()
        await other.commit()
    job_row_traffic.clear()
    clock.advance(supervisor.config.leader_tick_seconds)
    assert await wait_for_runs(supervisor.store.engine, "asked", 1) == [("ok", T0)]


async def test_a_run_now_written_in_a_replica_role_session_runs_by_the_next_tick(
    start_scheduler: StartScheduler, database_url: str, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="asked")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other:
        await other.execute("SET session_replication_role = replica")
        await other.execute(
            "UPDATE scheduler_jobs SET run_requested_at = %s WHERE id = 'asked'", (T0,)
        )
    # One tick: the write committed before it read.
    job_row_traffic.clear()
    clock.advance(supervisor.config.leader_tick_seconds)
    await asyncio.wait_for(job_row_traffic.heartbeat.wait(), 10)
    assert await wait_for_runs(supervisor.store.engine, "asked", 1, timeout=5) == [("ok", T0)]


async def test_a_leaders_registration_leaves_its_inserts_unmarked_with_the_marks_always_on(
    start_scheduler: StartScheduler, database_url: str
) -> None:
    # The marks fire in every session now; the registration's inserts are still left
    # unmarked by its own transaction setting, so a first boot adds no change to read.
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="registered")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as other:
        mark = await (
            await other.execute(
                "SELECT changed_xid::text FROM scheduler_jobs WHERE id = 'registered'"
            )
        ).fetchone()
    assert mark == ("0",)


async def test_a_run_now_written_with_the_row_inserted_again_runs_by_the_next_tick(
    start_scheduler: StartScheduler, database_url: str, job_row_traffic: JobRowTraffic
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="asked")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    other = await psycopg.AsyncConnection.connect(database_url)
    async with other, other.transaction():
        row = await (
            await other.execute(
                "SELECT schedule, name, trigger, leader_only, next_run_at"
                " FROM scheduler_jobs WHERE id = 'asked'"
            )
        ).fetchone()
        assert row is not None
        await other.execute("DELETE FROM scheduler_jobs WHERE id = 'asked'")
        await other.execute(
            "INSERT INTO scheduler_jobs"
            " (schedule, id, name, trigger, leader_only, next_run_at, run_requested_at)"
            " VALUES (%s, 'asked', %s, %s, %s, %s, %s)",
            (*row, T0),
        )
    tick = supervisor.config.leader_tick_seconds
    for _ in range(2):
        # The tick's own sleep, not a count of sleepers: a wake may have run the asked
        # job already, and its running lease's renewal sleeps too.
        await clock.wait_for_a_sleeper_until(clock.now() + timedelta(seconds=tick))
        job_row_traffic.clear()
        clock.advance(tick)
        await asyncio.wait_for(job_row_traffic.heartbeat.wait(), 10)
    assert await wait_for_runs(supervisor.store.engine, "asked", 1, timeout=5) == [("ok", T0)]


class _Database:
    """Autocommit connections of the test, as other processes would hold them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connections: list[psycopg.AsyncConnection[tuple[object, ...]]] = []

    async def connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
        self.connections.append(conn)
        return conn

    async def one(self, query: str, params: tuple[object, ...]) -> object:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            row = await (await conn.execute(query, params)).fetchone()
            return None if row is None else row[0]

    async def waiting(self, pattern: str) -> int:
        """The backend of the statement matching ``pattern`` once it waits on a lock."""
        found: list[int] = []

        async def waits() -> bool:
            pid = await self.one(_WAITING, (pattern,))
            found[:] = [pid] if isinstance(pid, int) else []
            return bool(found)

        await eventually(waits, what=f"a statement like {pattern!r} waiting on a lock")
        return found[0]


@pytest.fixture
async def other_processes(database_url: str) -> AsyncIterator[_Database]:
    database = _Database(database_url)
    try:
        yield database
    finally:
        for conn in database.connections:
            await conn.close()


async def _tick(clock: FakeClock, traffic: JobRowTraffic, seconds: float, sleepers: int) -> None:
    await clock.wait_for_sleepers(sleepers)
    traffic.clear()
    clock.advance(seconds)
    await asyncio.wait_for(traffic.heartbeat.wait(), 10)


async def test_a_run_now_the_tick_saw_during_a_claim_runs_though_the_read_after_the_claim_failed(
    start_scheduler: StartScheduler,
    other_processes: _Database,
    job_row_traffic: JobRowTraffic,
) -> None:
    clock = FakeClock(T0)
    scheduler = Scheduler()
    # b_asked is claimed alone first (its wake's order), a_refused after it.
    scheduler.job(every(hours=1), id="b_asked")(_noop)
    scheduler.job(every(hours=1), id="a_refused")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    tick = supervisor.config.leader_tick_seconds

    setup = await other_processes.connect()
    await setup.execute(_REFUSE)
    await setup.execute("SELECT pg_advisory_lock(%s)", (REFUSAL_GATE,))
    runs_blocker = await other_processes.connect()
    await runs_blocker.execute("BEGIN")
    await runs_blocker.execute(_RUN_OF_THE_SLOT, (SLOT, SLOT))

    # The slot: the batch claim fails on a_refused; b_asked is claimed alone and waits
    # on the uncommitted run row, its job row locked.
    await _tick(clock, job_row_traffic, SLOT.timestamp() - T0.timestamp(), sleepers=2)
    await other_processes.waiting("%INSERT INTO scheduler_runs%")
    operator = await other_processes.connect()
    asking = asyncio.ensure_future(
        operator.execute(
            "UPDATE scheduler_jobs SET run_requested_at = %s WHERE id = 'b_asked'", (ASKED_AT,)
        )
    )
    await other_processes.waiting("UPDATE scheduler_jobs SET run_requested_at%")
    # b_asked's claim commits, and the run-now that waited on its row right after.
    await runs_blocker.execute("ROLLBACK")
    await asking

    async def refused_claim_waits() -> bool:
        return await other_processes.one(_GATE_WAITERS, (REFUSAL_GATE,)) == 1

    await eventually(refused_claim_waits, what="a_refused's own claim waiting")
    # The tick reads the run-now while b_asked's claim is still under way.
    await _tick(clock, job_row_traffic, tick, sleepers=1)

    # The read after the claims waits on a table lock and loses its connection there.
    locker = await other_processes.connect()
    await locker.execute("BEGIN")
    locking = asyncio.ensure_future(
        locker.execute("LOCK TABLE scheduler_jobs IN ACCESS EXCLUSIVE MODE")
    )
    await other_processes.waiting("LOCK TABLE scheduler_jobs%")
    await setup.execute("SELECT pg_advisory_unlock(%s)", (REFUSAL_GATE,))
    await locking
    reader = await other_processes.waiting("SELECT id, next_run_at, paused, run_requested_at%")
    await setup.execute("SELECT pg_terminate_backend(%s)", (reader,))
    await locker.execute("ROLLBACK")

    async def asked_run_recorded() -> bool:
        found = await other_processes.one(
            "SELECT count(*) FROM scheduler_runs WHERE job_id = 'b_asked' AND manual AND slot = %s",
            (ASKED_AT,),
        )
        return found == 1

    # Two more ticks, woken as the admin wakes them (the clock would race the body's
    # lease keeper for the sleeper count).
    for _ in range(2):
        job_row_traffic.clear()
        await setup.execute(f"NOTIFY {WAKE_CHANNEL}")
        await asyncio.wait_for(job_row_traffic.heartbeat.wait(), 10)
    await eventually(asked_run_recorded, timeout=5, what="the run-now of b_asked")
