"""One job row that another transaction keeps locked (a long admin transaction, a stuck
claim) must not stop the other runs of the process: their outcomes are recorded and
their running leases renewed while it stays locked."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock, JobContext, Scheduler, every
from app.scheduler.errors import JobRowBusyError
from app.scheduler.registry import JobSpec
from app.scheduler.runner import Due, Runner
from app.scheduler.store import JobStore
from app.testing.claims import claim_leader

from .conftest import eventually

T0 = datetime(2026, 1, 1, tzinfo=UTC)
UTC_ZONE = ZoneInfo("UTC")
LEASE_SECONDS = 3.0


class Gates:
    """Async bodies that each wait for their own gate."""

    def __init__(self, *job_ids: str) -> None:
        self.open = {job_id: asyncio.Event() for job_id in job_ids}
        self.entered = {job_id: asyncio.Event() for job_id in job_ids}

    async def __call__(self, ctx: JobContext) -> None:
        self.entered[ctx.job_id].set()
        await self.open[ctx.job_id].wait()


def _specs(gates: Gates) -> list[JobSpec]:
    scheduler = Scheduler()
    for job_id in gates.open:
        scheduler.job(every(seconds=1), id=job_id, first_run=0)(gates)
    return list(scheduler.jobs.values())


def _runner(
    database: Database, clock: FakeClock, *, pid: int = 1, lease_seconds: float = LEASE_SECONDS
) -> Runner:
    return Runner(
        JobStore(database.engine, pid=pid, host="test", lease_clock=clock),
        clock=clock,
        zone=UTC_ZONE,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        lease_seconds=lease_seconds,
    )


async def _start_all(runner: Runner, gates: Gates, clock: FakeClock) -> list[asyncio.Task[None]]:
    specs = _specs(gates)
    rows = await runner.store.register_leader_jobs(specs, clock.now(), UTC_ZONE)
    tasks = []
    for spec in specs:
        claim = await claim_leader(runner, spec, rows[spec.id].next_run_at, None)
        assert claim is not None and claim.runs
        tasks.append(runner.start(spec, claim))
    for entered in gates.entered.values():
        await asyncio.wait_for(entered.wait(), 10)
    return tasks


@asynccontextmanager
async def _locked_job_row(engine: AsyncEngine, job_id: str) -> AsyncIterator[None]:
    """Another session holds job ``job_id``'s row locked until the block ends."""
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT 1 FROM scheduler_jobs WHERE id = :id FOR UPDATE"), {"id": job_id}
        )
        try:
            yield
        finally:
            await conn.rollback()


async def _run_status(engine: AsyncEngine, job_id: str) -> str:
    async with engine.connect() as conn:
        status: str = (
            await conn.execute(
                text(
                    "SELECT status FROM scheduler_runs WHERE job_id = :id ORDER BY id DESC LIMIT 1"
                ),
                {"id": job_id},
            )
        ).scalar_one()
        return status


async def _lease_until(engine: AsyncEngine, job_id: str) -> datetime | None:
    async with engine.connect() as conn:
        until: datetime | None = (
            await conn.execute(
                text("SELECT running_until FROM scheduler_jobs WHERE id = :id"), {"id": job_id}
            )
        ).scalar_one()
        return until


async def test_an_outcome_is_recorded_while_another_jobs_row_stays_locked(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    runner = _runner(database, clock)
    gates = Gates("a-stuck", "b-free")
    tasks = await _start_all(runner, gates, clock)
    try:
        async with _locked_job_row(engine, "a-stuck"):
            gates.open["a-stuck"].set()

            async def a_waits() -> bool:
                return await _lock_waiters(engine) >= 1

            await eventually(a_waits, what="a-stuck's outcome write waiting on its row")
            gates.open["b-free"].set()

            async def b_recorded() -> bool:
                return await _run_status(engine, "b-free") == "ok"

            # b-free's own row is free: its outcome lands at once without batching.
            await eventually(b_recorded, timeout=5, what="b-free's outcome while a is locked")
    finally:
        for gate in gates.open.values():
            gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def test_a_running_lease_is_renewed_while_another_jobs_row_stays_locked(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    runner = _runner(database, clock)
    gates = Gates("a-stuck", "b-free")
    tasks = await _start_all(runner, gates, clock)
    try:
        async with _locked_job_row(engine, "a-stuck"):
            step = LEASE_SECONDS / 12
            for _ in range(36):  # three leases' time
                await clock.wait_for_sleepers(1, timeout=10)
                moment = clock.now() + timedelta(seconds=step)
                until = await _lease_until(engine, "b-free")
                assert until is not None and until > moment, (
                    f"b-free's lease lapsed at {moment - T0} into its run, its body still running"
                )
                clock.set(moment)
    finally:
        for gate in gates.open.values():
            gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 60)


async def _lock_waiters(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        waiting: int = (
            await conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
        ).scalar_one()
        return waiting


async def _other_jobs_of_a_grown_schedule(engine: AsyncEngine, count: int) -> None:
    """Paused jobs that never run, analyzed: the planner then joins a batch of leases
    to its job rows in the batch's order, as on a production schedule of that size."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO scheduler_jobs (schedule, id, name, trigger, leader_only,"
                " next_run_at, paused) SELECT 'default', 'other-' || g, 'other', 'never',"
                " true, now() + interval '1 year', true FROM generate_series(1, :count) g"
            ),
            {"count": count},
        )
        await conn.execute(text("ANALYZE scheduler_jobs"))


async def test_a_batched_renewal_and_another_leaders_claim_of_the_same_jobs_never_deadlock(
    database: Database, engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(T0)
    owner = _runner(database, clock, pid=1, lease_seconds=6)
    gates = Gates("a", "b")
    specs = {spec.id: spec for spec in _specs(gates)}
    rows = await owner.store.register_leader_jobs(list(specs.values()), clock.now(), UTC_ZONE)
    await _other_jobs_of_a_grown_schedule(engine, 1000)
    tasks = []
    next_slots = {}
    # b starts first: the process holds its leases in the order b, a.
    for job_id in ("b", "a"):
        claim = await claim_leader(owner, specs[job_id], rows[job_id].next_run_at, None)
        assert claim is not None and claim.runs
        next_slots[job_id] = claim.next_slot
        tasks.append(owner.start(specs[job_id], claim))
        await asyncio.wait_for(gates.entered[job_id].wait(), 10)
    await clock.wait_for_sleepers(1)
    # A new leader (after a handover) claims the next slots of both jobs.
    successor = _runner(database, clock, pid=2, lease_seconds=6)
    clock.set(max(next_slots.values()))
    try:
        async with _locked_job_row(engine, "a"):
            clock.set(T0 + timedelta(seconds=2))  # a third of the lease: renewal of b, a
            # The renewal (on the run rows; each job row's copy only where it is free)
            # goes by a's held row without waiting on it.
            await clock.wait_for_sleepers(1, timeout=10)
            # The claim waits on neither row: a held row is left out, not waited on.
            claims = await asyncio.wait_for(
                successor.claim_many([Due(specs[j], next_slots[j]) for j in ("a", "b")], None),
                10,
            )
        assert isinstance(claims[0], JobRowBusyError), claims
        assert all(
            claim is None or not isinstance(claim, Exception) or isinstance(claim, JobRowBusyError)
            for claim in claims
        )
        await clock.wait_for_sleepers(1, timeout=30)
        assert "deadlock detected" not in caplog.text
    finally:
        for gate in gates.open.values():
            gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def _refuse_renewals_of(engine: AsyncEngine, job_id: str) -> None:
    """The database refuses every lease renewal of one job's row (a failing write, not
    a mocked one); every other row takes them."""
    async with engine.begin() as conn:
        await conn.execute(
            text(
                """
                CREATE FUNCTION refuse_renewal() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN RAISE EXCEPTION 'renewal refused by the test'; END $$
                """
            )
        )
        await conn.execute(
            text(
                "CREATE TRIGGER refuse_renewal BEFORE UPDATE ON scheduler_jobs FOR EACH ROW"
                f" WHEN (OLD.id = '{job_id}' AND OLD.running_run_id = NEW.running_run_id"
                " AND NEW.running_until > OLD.running_until)"
                " EXECUTE FUNCTION refuse_renewal()"
            )
        )


async def test_a_running_lease_is_renewed_while_the_database_refuses_another_jobs_renewal(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    runner = _runner(database, clock)
    gates = Gates("a-refused", "b-free")
    tasks = await _start_all(runner, gates, clock)
    await _refuse_renewals_of(engine, "a-refused")
    try:
        step = LEASE_SECONDS / 12
        for _ in range(36):  # three leases' time
            await clock.wait_for_sleepers(1, timeout=10)
            moment = clock.now() + timedelta(seconds=step)
            until = await _lease_until(engine, "b-free")
            assert until is not None and until > moment, (
                f"b-free's lease lapsed at {moment - T0} into its run, its body still running"
            )
            clock.set(moment)
    finally:
        for gate in gates.open.values():
            gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)


async def test_another_leader_never_starts_a_job_whose_body_runs_while_a_renewal_is_refused(
    database: Database, engine: AsyncEngine
) -> None:
    clock = FakeClock(T0)
    owner = _runner(database, clock)
    gates = Gates("a-refused", "b-free")
    specs = {spec.id: spec for spec in _specs(gates)}
    rows = await owner.store.register_leader_jobs(list(specs.values()), clock.now(), UTC_ZONE)
    tasks, next_slots = [], {}
    for job_id in ("a-refused", "b-free"):
        claim = await claim_leader(owner, specs[job_id], rows[job_id].next_run_at, None)
        assert claim is not None and claim.runs
        next_slots[job_id] = claim.next_slot
        tasks.append(owner.start(specs[job_id], claim))
        await asyncio.wait_for(gates.entered[job_id].wait(), 10)
    await _refuse_renewals_of(engine, "a-refused")
    successor = _runner(database, clock, pid=2)
    try:
        step = LEASE_SECONDS / 12
        for _ in range(18):  # a lease and a half, b-free's body running all along
            await clock.wait_for_sleepers(1, timeout=10)
            clock.advance(step)
        await clock.wait_for_sleepers(1, timeout=10)
        claim = await claim_leader(successor, specs["b-free"], next_slots["b-free"], None)
        assert claim is not None
        assert not claim.runs, "a second body of b-free started while the first still runs"
    finally:
        for gate in gates.open.values():
            gate.set()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 30)
