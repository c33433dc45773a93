"""A running lease and the statuses around it stay true at the edges: a renewal that
fails now and then never lets a live run's lease lapse; a late outcome of a reaped run
never takes the job row from a newer run that holds the lease; a run is never left
'running' without a lease when its outcome write failed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.registry import JobSpec
from app.scheduler.store import Outcome
from app.scheduler.threads import keep_lease
from app.testing.claims import claim_leader

from .conftest import BlockingBodies, eventually, make_runner

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")


async def _fail_updates(engine: AsyncEngine, table: str, when: str, times: int) -> None:
    """Make the database refuse the first ``times`` updates of ``table`` that match
    ``when`` (a trigger's WHEN on OLD and NEW): a failing write, not a mocked one. The
    count lives in a sequence, which a refused transaction does not roll back."""
    async with engine.begin() as conn:
        await conn.execute(text("CREATE SEQUENCE refused_writes"))
        await conn.execute(
            text(
                f"""
                CREATE FUNCTION refuse_write() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                    IF nextval('refused_writes') <= {times} THEN
                        RAISE EXCEPTION 'write refused by the test';
                    END IF;
                    RETURN NEW;
                END $$
                """
            )
        )
        await conn.execute(
            text(
                f"CREATE TRIGGER refuse_write BEFORE UPDATE ON {table} FOR EACH ROW"
                f" WHEN ({when}) EXECUTE FUNCTION refuse_write()"
            )
        )


async def _matching_writes(engine: AsyncEngine) -> int:
    """How many writes met the refusing trigger so far, refused or let through."""
    async with engine.connect() as conn:
        query = text("SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM refused_writes")
        count: int = (await conn.execute(query)).scalar_one()
        return count


async def _job_row(engine: AsyncEngine, job_id: str) -> tuple[object, ...]:
    async with engine.connect() as conn:
        query = text(
            "SELECT last_status, running_run_id, running_until FROM scheduler_jobs WHERE id = :id"
        )
        return tuple((await conn.execute(query, {"id": job_id})).one())


async def _run_rows(engine: AsyncEngine, job_id: str) -> list[tuple[object, ...]]:
    async with engine.connect() as conn:
        query = text(
            "SELECT id, status, running_until FROM scheduler_runs WHERE job_id = :id ORDER BY id"
        )
        return [tuple(row) for row in await conn.execute(query, {"id": job_id})]


def _job(func: Callable[..., object], job_id: str, timeout: float | None = None) -> JobSpec:
    scheduler = Scheduler()
    scheduler.job(every(seconds=1), id=job_id, first_run=0, timeout=timeout)(func)
    return scheduler.jobs[job_id]


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_renewal_that_fails_twice_never_lets_the_lease_of_a_live_run_lapse(
    database: Database, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    runner = make_runner(database, clock)
    spec = _job(bodies, "long")
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    # The renewals only: the claim sets the run id, the release clears the lease.
    await _fail_updates(
        engine,
        "scheduler_jobs",
        "OLD.running_run_id = NEW.running_run_id AND NEW.running_until > OLD.running_until",
        times=2,
    )
    claim = await claim_leader(runner, spec, rows["long"].next_run_at, None)
    assert claim is not None and claim.runs
    task = runner.start(spec, claim)
    await bodies.entered()
    step = runner.lease_seconds / 60
    for _ in range(180):  # three leases' time
        await clock.wait_for_sleepers()
        # The lease must hold at the next instant, before its owner acts at it.
        moment = clock.now() + timedelta(seconds=step)
        _, _, until = await _job_row(engine, "long")
        assert isinstance(until, datetime) and until > moment, (
            f"the lease lapsed at {moment - T0} into the run"
        )
        clock.set(moment)
    assert await _matching_writes(engine) >= 3  # two refused renewals, then more
    bodies.release.set()
    await task


async def test_a_late_outcome_of_a_reaped_run_leaves_the_job_to_the_run_that_holds_its_lease(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    runner = make_runner(database, clock)
    spec = _job(_noop, "tick")
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    late = await claim_leader(runner, spec, rows["tick"].next_run_at, None)
    assert late is not None and late.runs
    clock.advance(runner.lease_seconds + 1)
    # Its owner froze past the lease: the next claim reaps it and starts a newer run.
    newer = await claim_leader(runner, spec, late.next_slot, None)
    assert newer is not None and newer.runs
    await runner.store.finish_many([Outcome(late.run_id, "tick", "ok", clock.now(), 1, None)])
    assert (await _job_row(engine, "tick"))[:2] == ("running", newer.run_id)
    assert [status for _, status, _ in await _run_rows(engine, "tick")] == ["ok", "running"]


async def _a_write_was_refused(engine: AsyncEngine) -> None:
    async def refused() -> bool:
        return await _matching_writes(engine) >= 1

    await eventually(refused, what="the refused write")


async def test_a_timed_out_per_worker_thread_whose_timeout_write_failed_is_settled_as_it_ends(
    database: Database, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    runner = make_runner(database, clock)
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="sweep", leader_only=False, timeout=0.1)(bodies)
    spec = scheduler.jobs["sweep"]
    await runner.store.register_replica_jobs([spec], clock.now(), UTC_ZONE)
    await _fail_updates(engine, "scheduler_runs", "NEW.status = 'timeout'", times=1)
    fire = asyncio.create_task(runner.fire_replica(spec, T0))
    await bodies.entered()
    await _a_write_was_refused(engine)
    bodies.release.set()
    await fire
    [(_, status, until)] = await _run_rows(engine, "sweep")
    assert (status, until) == ("timeout", None)


async def test_a_timed_out_leader_thread_whose_timeout_write_failed_is_settled_as_it_ends(
    database: Database, engine: AsyncEngine, bodies: BlockingBodies
) -> None:
    clock = FakeClock(T0)
    runner = make_runner(database, clock)
    spec = _job(bodies, "long", timeout=0.1)
    rows = await runner.store.register_leader_jobs([spec], clock.now(), UTC_ZONE)
    await _fail_updates(engine, "scheduler_runs", "NEW.status = 'timeout'", times=1)
    claim = await claim_leader(runner, spec, rows["long"].next_run_at, None)
    assert claim is not None and claim.runs
    task = runner.start(spec, claim)
    await bodies.entered()
    await _a_write_was_refused(engine)
    bodies.release.set()
    await task
    assert [status for _, status, _ in await _run_rows(engine, "long")] == ["timeout"]
    assert await _job_row(engine, "long") == ("timeout", None, None)


def test_the_lease_keeper_thread_retries_a_failed_renewal_within_seconds() -> None:
    """The keeper that renews a thread's lease once the event loop is gone: two failed
    renewals must not push the next attempt a whole period (a third of the lease) on."""
    attempts: list[int] = []
    third_attempt, body_ended = threading.Event(), threading.Event()

    def renew() -> bool:
        attempts.append(1)
        if len(attempts) <= 2:
            raise ConnectionError("the database did not answer")
        third_attempt.set()
        return True

    keeper = keep_lease(renew, period=60, until=body_ended, job_id="long", run_id=1)
    try:
        assert third_attempt.wait(10), f"{len(attempts)} attempts within 10 s"
    finally:
        body_ended.set()
        keeper.join(10)
