"""A batch claim is the single claim applied to many jobs at once: for any mix of job
states (paused, slot moved on, run-now pending, a running lease held or lapsed, the
slot already in the history) and claims (slots, requests, runs, missed, skipped,
passed-over slots, fenced or not), claiming them together gives exactly what claiming
each alone gives: the same winners and statuses, the same job rows and run rows."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.scheduler import FakeClock
from app.scheduler.errors import JobRowBusyError
from app.scheduler.store import ClaimedSlot, JobStore, SlotClaim
from app.testing import TestServer

T0 = datetime(2026, 1, 1, 12, tzinfo=UTC)
SLOT = T0 - timedelta(minutes=1)
NEXT = T0 + timedelta(minutes=1)
REQUEST = T0 - timedelta(seconds=10)
FOREIGN_RUN = 900_000


@dataclass(frozen=True)
class JobCase:
    """One job's stored state and the claim made of it."""

    paused: bool
    moved_on: bool
    requested: bool
    lease: str  # none | held | lapsed
    recorded: bool
    manual: bool
    status: str
    missed_before: bool


job_cases = st.builds(
    JobCase,
    paused=st.booleans(),
    moved_on=st.booleans(),
    requested=st.booleans(),
    lease=st.sampled_from(["none", "held", "lapsed"]),
    recorded=st.booleans(),
    manual=st.booleans(),
    status=st.sampled_from(["running", "missed", "skipped_overlap"]),
    missed_before=st.booleans(),
)


@pytest.fixture(scope="module")
def claim_database(pg_server: TestServer) -> Iterator[str]:
    """One migrated database for every example; each example starts from empty tables."""
    url = pg_server.create_database()
    try:
        yield url
    finally:
        pg_server.release_database(url)


@settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    cases=st.lists(job_cases, min_size=1, max_size=6),
    fence=st.sampled_from(["none", "held", "gone"]),
)
def test_a_batch_claim_gives_what_claiming_each_alone_gives(
    claim_database: str, cases: list[JobCase], fence: str
) -> None:
    together, alone = asyncio.run(_both(claim_database, cases, fence))
    assert together == alone


async def _both(url: str, cases: list[JobCase], fence: str) -> tuple[Any, Any]:
    database = Database.from_url(url)
    holder = await asyncpg.connect(asyncpg_dsn(url))
    try:
        store = JobStore(database.engine, pid=4242, host="here", lease_clock=FakeClock(T0))
        fence_pid = None
        if fence != "none":
            await holder.execute(store.key.call("pg_advisory_lock"), *store.key.args)
            fence_pid = await holder.fetchval("SELECT pg_backend_pid()")
            if fence == "gone":
                await holder.execute(store.key.call("pg_advisory_unlock"), *store.key.args)
        items = [_item(index, case) for index, case in enumerate(cases)]
        await _seed(database, cases)
        claimed = await store.claim_many(items, now=T0, fence_pid=fence_pid)
        together = await _outcome(database, claimed)
        await _seed(database, cases)
        claimed = [
            (await store.claim_many([item], now=T0, fence_pid=fence_pid))[0] for item in items
        ]
        alone = await _outcome(database, claimed)
        return together, alone
    finally:
        await holder.close()
        await database.dispose()


def _item(index: int, case: JobCase) -> SlotClaim:
    job_id = f"job-{index}"
    lease = 30.0 if case.status == "running" else None
    if case.manual:
        return SlotClaim.request(job_id, REQUEST, status=case.status, lease_seconds=lease)
    before = (SLOT - timedelta(minutes=5), "passed over") if case.missed_before else None
    return SlotClaim(
        job_id,
        SLOT,
        SLOT,
        NEXT,
        case.status,
        lease_seconds=lease,
        error="skipped" if case.status != "running" else None,
        missed_before=before,
        jitter=0.5,
    )


async def _seed(database: Database, cases: list[JobCase]) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(text("DELETE FROM scheduler_runs"))
        await conn.execute(text("DELETE FROM scheduler_jobs"))
        for index, case in enumerate(cases):
            job_id = f"job-{index}"
            until = {"none": None, "held": T0 + timedelta(seconds=20)}.get(
                case.lease, T0 - timedelta(seconds=1)
            )
            await conn.execute(
                text(
                    "INSERT INTO scheduler_jobs (schedule, id, name, trigger, leader_only,"
                    " next_run_at, paused, run_requested_at, last_status, running_run_id,"
                    " running_since, running_until, running_pid, running_host)"
                    " VALUES ('default', :id, :id, 'every 60s', true, :next_run_at, :paused,"
                    " :requested, :status, :run_id, :since, :until, :pid, :host)"
                ),
                {
                    "id": job_id,
                    "next_run_at": NEXT if case.moved_on else SLOT,
                    "paused": case.paused,
                    "requested": REQUEST if case.requested else None,
                    "status": None if until is None else "running",
                    "run_id": None if until is None else FOREIGN_RUN + index,
                    "since": None if until is None else T0 - timedelta(minutes=2),
                    "until": until,
                    "pid": None if until is None else 7,
                    "host": None if until is None else "elsewhere",
                },
            )
            if until is not None:
                # The run that holds (or held) the lease.
                await conn.execute(
                    text(
                        "INSERT INTO scheduler_runs (id, schedule, job_id, scope, slot, manual,"
                        " started_at, status, lateness_ms, jitter_ms, pid, host)"
                        " VALUES (:run_id, 'default', :id, 'leader', :slot, false, :slot,"
                        " 'running', 0, 0, 7, 'elsewhere')"
                    ),
                    {
                        "run_id": FOREIGN_RUN + index,
                        "id": job_id,
                        "slot": SLOT - timedelta(minutes=2),
                    },
                )
            if case.recorded:
                await conn.execute(
                    text(
                        "INSERT INTO scheduler_runs (id, schedule, job_id, scope, slot, manual,"
                        " started_at, finished_at, status, lateness_ms, jitter_ms, pid, host)"
                        " VALUES (:run_id, 'default', :id, 'leader', :slot, :manual, :slot,"
                        " :slot, 'ok', 0, 0, 7, 'elsewhere')"
                    ),
                    {
                        "run_id": FOREIGN_RUN + 100 + index,
                        "id": job_id,
                        "slot": REQUEST if case.manual else SLOT,
                        "manual": case.manual,
                    },
                )


async def _outcome(database: Database, claimed: list[ClaimedSlot | JobRowBusyError | None]) -> Any:
    """The claims' answers and every row they wrote, with run ids named by their run
    (job, slot, manual): the two ways allocate ids in a different order."""
    async with database.engine.connect() as conn:
        runs = list(
            await conn.execute(
                text(
                    "SELECT id, job_id, slot, manual, status, started_at, finished_at,"
                    " lateness_ms, jitter_ms, pid, host, error FROM scheduler_runs"
                    " ORDER BY job_id, slot, manual"
                )
            )
        )
        jobs = list(
            await conn.execute(
                text(
                    "SELECT id, next_run_at, paused, run_requested_at, last_status,"
                    " last_started_at, running_run_id, running_since, running_until,"
                    " running_pid, running_host, last_finished_at, last_error"
                    " FROM scheduler_jobs ORDER BY id"
                )
            )
        )
    names = {row.id: (row.job_id, row.slot, row.manual) for row in runs}

    def name(run_id: int | None) -> object:
        return names.get(run_id, run_id) if run_id is not None else None

    answers = [
        (name(claim.run_id), claim.status, claim.term, claim.next_slot, claim.error)
        if isinstance(claim, ClaimedSlot)
        else claim and str(claim)
        for claim in claimed
    ]
    run_rows = [(names[row.id], *tuple(row)[4:]) for row in runs]
    # A run's own id is in history order within its job; named, not compared raw.
    job_rows = [(*tuple(row)[:6], name(row.running_run_id), *tuple(row)[7:]) for row in jobs]
    return answers, run_rows, job_rows
