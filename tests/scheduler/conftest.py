"""Scheduler test helpers: who holds the key, which runs were recorded."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db import Database, asyncpg_dsn
from app.scheduler import FakeClock, JobContext, Scheduler, SchedulerConfig, cron
from app.scheduler.keys import LEADER_KEY_LOCKS, SCHEDULER_LEADER_KEY
from app.scheduler.retry import BUSY_ROW
from app.scheduler.runner import Runner
from app.scheduler.store import JobStore
from app.testing.server import TestServer

from ..conftest import StartScheduler
from ..procs.cluster import PROBE_TABLE_SQL, Cluster
from ..procs.gated_app import GATE_KEY, GATED_TABLE_SQL
from ..procs.replica_app import REPLICA_BODIES_SQL
from ..procs.service_app import SERVICE_COPIES_SQL

__all__ = [
    "SERVICE_LEASE_SECONDS",
    "BlockingBodies",
    "CopiesInThreads",
    "JobRowTraffic",
    "StandbyProcesses",
    "StartScheduler",
    "eventually",
    "holder_count",
    "lease_ends_at",
    "make_runner",
    "one_host_queued_one",
    "row_held",
    "runs",
    "runs_settled",
    "wait_for_runs",
    "waiting_count",
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]

HOLDERS_SQL = text(f"SELECT count(*) FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND granted")
WAITERS_SQL = text(f"SELECT count(*) FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND NOT granted")


def asyncpg_over_tcp(server: TestServer, database_url: str) -> str:
    """The test database's DSN on the local test server's TCP port, for asyncpg. asyncpg
    has no ``require_auth``, so it is dropped: these tests connect while the server
    they started is up, not while another user could hold its port."""
    url = make_url(server.tcp_url_for(str(make_url(database_url).database)))
    return asyncpg_dsn(url.difference_update_query(["require_auth"]).render_as_string(False))


async def holder_count(engine: AsyncEngine) -> int:
    """How many sessions hold the leader key in this database (the seed's query)."""
    async with engine.connect() as conn:
        count: int = (await conn.execute(HOLDERS_SQL)).scalar_one()
        return count


async def waiting_count(engine: AsyncEngine) -> int:
    """How many sessions are queued for the leader key in this database."""
    async with engine.connect() as conn:
        count: int = (await conn.execute(WAITERS_SQL)).scalar_one()
        return count


async def eventually(
    condition: Callable[[], Awaitable[bool]], timeout: float = 10, what: str = "condition"
) -> None:
    """Re-check a database condition until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def runs(engine: AsyncEngine, job_id: str) -> list[tuple[str, Any]]:
    """(status, slot) of every recorded run of a job, oldest first."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT status, slot FROM scheduler_runs WHERE job_id = :id ORDER BY id"),
            {"id": job_id},
        )
        return [(row.status, row.slot) for row in result]


async def wait_for_runs(
    engine: AsyncEngine, job_id: str, count: int, *, finished: bool = True, timeout: float = 10
) -> list[tuple[str, Any]]:
    """Wait until ``count`` runs of the job are recorded (and finished)."""

    async def enough() -> bool:
        rows = await runs(engine, job_id)
        done = [row for row in rows if not finished or row[0] != "running"]
        return len(done) >= count

    await eventually(enough, timeout, f"{count} runs of {job_id}")
    return await runs(engine, job_id)


async def wait_for_runs_past_busy_rows(
    engine: AsyncEngine,
    clock: FakeClock,
    job_id: str,
    count: int,
    *,
    sleepers: int,
    retries: int = 5,
) -> list[tuple[str, Any]]:
    """Wait until ``count`` runs of the job are recorded, finished or not, when a claim
    may meet the job's row held for a moment (a running body's lease renewal woken by
    the same clock step): such a claim is retried after retry.BUSY_ROW's wait on the
    clock, which only the test moves. Each round waits until the ``sleepers`` loops are
    parked again (the claim is done), then moves the clock past the next busy-row wait."""
    for failures in range(1, retries + 1):
        await clock.wait_for_sleepers(sleepers)
        history = await runs(engine, job_id)
        if len(history) >= count:
            return history
        clock.advance(BUSY_ROW.delay(failures))
    raise AssertionError(f"{count} runs of {job_id} not recorded after {retries} busy-row retries")


async def runs_settled(engine: AsyncEngine, job_id: str, count: int) -> bool:
    """At least ``count`` runs of the job are recorded and none of them still runs."""
    statuses = [status for status, _ in await runs(engine, job_id)]
    return len(statuses) >= count and "running" not in statuses


class BlockingBodies:
    """A sync job body that blocks until released and counts how many run at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.most_at_once = 0
        self._entered = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._running = 0

    def __call__(self, ctx: object) -> None:
        with self._lock:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
        self._entered.release()
        try:
            self.release.wait(30)
        finally:
            with self._lock:
                self._running -= 1

    async def entered(self, timeout: float = 10) -> None:
        """Return once one more body has started (each start is counted once)."""
        if not await asyncio.to_thread(self._entered.acquire, True, timeout):
            raise AssertionError("timed out waiting for a body to start")


@dataclass
class Copy:
    """One copy of a service (or one run of a job body): when its body began and when
    the blocking step it ran in a thread ended (None while it runs), on time.monotonic."""

    label: str
    began: float
    thread_ended: float | None = None


class CopiesInThreads:
    """Bodies (service copies, async job runs) that each do one blocking step through
    ``asyncio.to_thread``: the step blocks until ``release`` is set. Records every copy,
    so a test can say whether two ever ran at once."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.copies: list[Copy] = []
        self._in_thread = threading.Semaphore(0)

    async def run_one(self, label: str) -> None:
        """The body of one copy: record it, then block in a thread until released."""
        copy = Copy(label, time.monotonic())
        self.copies.append(copy)
        await asyncio.to_thread(self._block, copy)

    def _block(self, copy: Copy) -> None:
        self._in_thread.release()
        try:
            self.release.wait(30)
        finally:
            copy.thread_ended = time.monotonic()

    async def in_thread(self, timeout: float = 10) -> None:
        """Return once one more copy's blocking step has started in its thread."""
        if not await asyncio.to_thread(self._in_thread.acquire, True, timeout):
            raise AssertionError("timed out waiting for a copy's thread to start")

    def labels(self) -> list[str]:
        """The copies' labels, in the order they began."""
        return [copy.label for copy in self.copies]

    def overlaps(self) -> list[tuple[str, str]]:
        """Each pair (earlier, later) where the later copy began while the earlier one's
        thread still ran: an overlap of two copies."""
        return [
            (earlier.label, later.label)
            for i, earlier in enumerate(self.copies)
            for later in self.copies[i + 1 :]
            if earlier.thread_ended is None or later.began < earlier.thread_ended
        ]


@pytest.fixture
def copies_in_threads() -> Iterator[CopiesInThreads]:
    """Copies that block in a thread; released at teardown so no thread outlives the test."""
    copies = CopiesInThreads()
    yield copies
    copies.release.set()


# The service cluster's lease: long beside the time a new leader takes to promote, so that
# a copy started before a dead copy's lease ran out shows plainly.
SERVICE_LEASE_SECONDS = 10


@pytest.fixture
def service_cluster(
    database_url: str, tmp_path: Path, gate: psycopg.Connection[tuple[object, ...]]
) -> Iterator[Cluster]:
    """Two app processes with the gated service (tests/procs/service_app.py), leases of
    SERVICE_LEASE_SECONDS; the first copy's thread waits at the gate."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(SERVICE_COPIES_SQL)
    cluster = Cluster(
        database_url,
        tmp_path,
        app="tests.procs.service_app:app",
        env={"LEASE_SECONDS": str(SERVICE_LEASE_SECONDS)},
    )
    cluster.start(2)
    try:
        cluster.leader()
        cluster.wait_for(
            lambda: cluster.query("SELECT 1 FROM service_copies"), 20, "a copy of the service"
        )
        yield cluster
    finally:
        gate.execute("SELECT pg_advisory_unlock_all()")
        cluster.stop()


_WRITES_JOBS = re.compile(r"\b(UPDATE|INSERT INTO|DELETE FROM)\s+scheduler_jobs\b")


class JobRowTraffic:
    """How many scheduler_jobs rows the statements sent on an engine read and wrote
    (the driver's row count of each), and the leader's heartbeats: a tick's last
    statement, so ``heartbeat`` is set once a tick's work is done."""

    def __init__(self) -> None:
        self.read = 0
        self.written = 0
        self.heartbeat = asyncio.Event()

    def clear(self) -> None:
        """Count from zero, and wait for the next heartbeat."""
        self.read = self.written = 0
        self.heartbeat.clear()

    def record(self, statement: str, rowcount: int) -> None:
        """Count one statement's rows (a statement that writes job rows counts as a write)."""
        if "SET heartbeat_at" in statement:
            self.heartbeat.set()
        elif _WRITES_JOBS.search(statement):
            self.written += max(rowcount, 0)
        elif "FROM scheduler_jobs" in statement:
            self.read += max(rowcount, 0)


@pytest.fixture
def job_row_traffic(engine: AsyncEngine) -> Iterator[JobRowTraffic]:
    """The scheduler_jobs rows read and written on the test's engine from now on."""
    traffic = JobRowTraffic()

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        traffic.record(statement, cursor.rowcount)

    event.listen(engine.sync_engine, "after_cursor_execute", record)
    yield traffic
    event.remove(engine.sync_engine, "after_cursor_execute", record)


@pytest.fixture
def bodies() -> Iterator[BlockingBodies]:
    """Blocking sync bodies; released at teardown so no thread outlives the test."""
    blocking = BlockingBodies()
    yield blocking
    blocking.release.set()


@pytest.fixture
def gate(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Held by the test: every gated body (tests/procs/gated_app.py, replica_app.py)
    blocks in its thread until the gate opens; their tables are created."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(GATED_TABLE_SQL)
        conn.execute(REPLICA_BODIES_SQL)
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE_KEY,))
        yield conn


@pytest.fixture
def key_held_elsewhere(database_url: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """The leader key, held by another host (this connection) until the test unlocks it."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (SCHEDULER_LEADER_KEY,))
        yield conn


@pytest.fixture
def one_host(
    database_url: str,
    tmp_path: Path,
    key_held_elsewhere: psycopg.Connection[tuple[object, ...]],
) -> Iterator[Cluster]:
    """Three app processes sharing one runtime directory: three workers of one host,
    every one a standby while the key is held elsewhere."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(PROBE_TABLE_SQL)
    cluster = Cluster(database_url, tmp_path)
    cluster.start(3, runtime_dir=tmp_path / "host")
    try:
        yield cluster
    finally:
        cluster.stop()


def one_host_queued_one(cluster: Cluster) -> bool:
    """True once one worker of the host queues for the key in PostgreSQL and every
    other one waits for the host's lock file."""
    queued = cluster.queued()
    return len(queued) == 1 and all(
        "scheduler.host_standby" in cluster.log_of(pid)
        for pid in cluster.processes
        if pid not in queued
    )


class StandbyProcesses:
    """Processes that each open the lock connection and queue for the key (see
    tests/procs/standby.py); every one still running is SIGKILLed at teardown."""

    def __init__(self, lock_dsn: str) -> None:
        self.lock_dsn = lock_dsn
        self.processes: list[asyncio.subprocess.Process] = []

    async def start(self) -> asyncio.subprocess.Process:
        """Start one; return once its connection waits for the key."""
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.procs.standby",
            self.lock_dsn,
            cwd=PROJECT_ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        self.processes.append(process)
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        assert line == b"waiting\n", f"the standby process said {line!r}"
        return process

    async def kill(self, process: asyncio.subprocess.Process) -> None:
        """SIGKILL one, as the OOM killer or kill -9 would, and reap it."""
        process.send_signal(signal.SIGKILL)
        await process.wait()

    async def kill_all(self) -> None:
        for process in self.processes:
            if process.returncode is None:
                await self.kill(process)


@pytest.fixture
async def standby_processes(config: SchedulerConfig) -> AsyncIterator[StandbyProcesses]:
    """Start standby processes on this test's database; all are killed at teardown."""
    processes = StandbyProcesses(config.lock_dsn)
    try:
        yield processes
    finally:
        await processes.kill_all()


def make_runner(database: Database, clock: FakeClock, pid: int = 1) -> Runner:
    """A Runner of process ``pid`` on the test database, in UTC, on ``clock``: for tests
    that claim and run slots by hand, without a supervisor."""
    return Runner(
        JobStore(database.engine, pid=pid, host="test", lease_clock=clock),
        clock=clock,
        zone=ZoneInfo("UTC"),
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
    )


async def lease_elsewhere(engine: AsyncEngine, job_id: str, until: str, *extra: str) -> None:
    """Give the job's row the running lease of a run in another process (run 999999 of
    pid 999999 on host 'elsewhere'), lasting until the SQL expression ``until``;
    ``extra`` are more ``column = expression`` assignments of the same UPDATE."""
    assignments = ", ".join(
        [
            "running_run_id = 999999",
            "running_pid = 999999",
            "running_host = 'elsewhere'",
            "running_since = now()",
            f"running_until = {until}",
            *extra,
        ]
    )
    async with engine.begin() as conn:
        await conn.execute(
            text(f"UPDATE scheduler_jobs SET {assignments} WHERE id = :id"), {"id": job_id}
        )


async def lease_ends_at(engine: AsyncEngine, job_id: str, at: str | datetime) -> None:
    """Move the end of the running lease the job's current run holds to ``at`` (a
    datetime, or an SQL expression), where the lease lives: the run's own row and the
    job row's copy; as if its owner had stopped renewing it."""
    until = ":at" if isinstance(at, datetime) else at
    params: dict[str, object] = {"id": job_id}
    if isinstance(at, datetime):
        params["at"] = at
    async with engine.begin() as conn:
        await conn.execute(
            text(
                f"UPDATE scheduler_runs SET running_until = {until} WHERE id ="
                " (SELECT running_run_id FROM scheduler_jobs WHERE id = :id)"
            ),
            params,
        )
        await conn.execute(
            text(f"UPDATE scheduler_jobs SET running_until = {until} WHERE id = :id"), params
        )


@asynccontextmanager
async def row_held(engine: AsyncEngine, job_id: str) -> AsyncIterator[AsyncConnection]:
    """Another transaction holding the job's row (FOR UPDATE, as an operator's psql
    session left open would) until it rolls back or the block ends."""
    async with engine.connect() as holder:
        await holder.execute(
            text("SELECT 1 FROM scheduler_jobs WHERE id = :id FOR UPDATE"), {"id": job_id}
        )
        yield holder


@asynccontextmanager
async def service_row_held(engine: AsyncEngine, service_id: str) -> AsyncIterator[AsyncConnection]:
    """Another transaction holding the service's row in ``scheduler_services`` (FOR
    UPDATE, as an operator's psql session left open would) until it rolls back or the
    block ends."""
    async with engine.connect() as holder:
        await holder.execute(
            text("SELECT 1 FROM scheduler_services WHERE id = :id FOR UPDATE"), {"id": service_id}
        )
        yield holder


async def prepared_claim_waits(engine: AsyncEngine) -> bool:
    """A leader claim whose statements ran sits in an open transaction, waiting to
    commit at its slot (a claim prepared ahead)."""
    async with engine.connect() as conn:
        waiting = await conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE state = 'idle in transaction'"
                " AND query LIKE '%INSERT INTO scheduler_runs%'"
            )
        )
        return bool(waiting.scalar_one())


def minutely_recording(scheduler: Scheduler, started: list[tuple[datetime, datetime]]) -> None:
    """Register job "minutely" (every minute), which records its slot and the clock's
    time as it begins."""

    @scheduler.job(cron("* * * * *"), id="minutely")
    async def minutely(ctx: JobContext) -> None:
        started.append((ctx.scheduled_at, ctx.clock.now()))
