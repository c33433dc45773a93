"""Election: one holder per database, takeover on release, demotion on a dead lock connection.

The seed's tests, ported, and the one it says a new app adds.
"""

import asyncio
import logging
import os
import re
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, asyncpg_dsn
from app.operations.leadership import leader
from app.scheduler import (
    FakeClock,
    JobContext,
    Role,
    Scheduler,
    SchedulerConfig,
    ServiceContext,
    every,
)
from app.scheduler.election import LockConnection
from app.scheduler.keys import LEADER_KEY_LOCKS, SCHEDULER_LEADER_KEY
from app.scheduler.store import JobStore
from app.scheduler.supervisor import Supervisor
from app.testing.claims import claim_slot
from app.testing.server import TestServer

from .conftest import (
    StandbyProcesses,
    StartScheduler,
    asyncpg_over_tcp,
    eventually,
    holder_count,
    wait_for_runs,
    waiting_count,
)

APP_DIR = Path(__file__).resolve().parents[2] / "app"


async def test_singleton_lock_granted_when_uncontended(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    supervisor = await start_scheduler(Scheduler())
    await supervisor.wait_for_role(Role.LEADER)
    assert await holder_count(engine) == 1


async def test_lock_connection_is_idle_and_named_after_its_process(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    supervisor = await start_scheduler(Scheduler())
    await supervisor.wait_for_role(Role.LEADER)
    assert supervisor.lock is not None
    backend_pid = supervisor.lock.backend_pid
    names: list[str] = []

    async def idle() -> bool:
        # Between its ownership checks the connection is idle, never idle in transaction.
        async with engine.connect() as conn:
            row = (
                await conn.execute(
                    text("SELECT state, application_name FROM pg_stat_activity WHERE pid = :pid"),
                    {"pid": backend_pid},
                )
            ).one()
        names.append(row.application_name)
        assert row.state in ("idle", "active"), row.state
        return bool(row.state == "idle")

    await eventually(idle, what="the lock connection idle between checks")
    assert names[-1] == f"scheduler-leader:{os.getpid()}"


async def test_guarded_job_runs_body_when_uncontended(
    start_scheduler: StartScheduler, fake_clock: FakeClock
) -> None:
    ran = asyncio.Event()
    scheduler = Scheduler()

    @scheduler.job(every(seconds=30), id="guarded")
    async def guarded(ctx: JobContext) -> None:
        ran.set()

    supervisor = await start_scheduler(scheduler, clock=fake_clock)
    await supervisor.wait_for_role(Role.LEADER)
    await fake_clock.wait_for_sleepers(2)
    fake_clock.advance(30)
    await asyncio.wait_for(ran.wait(), 10)


async def test_xact_advisory_lock_is_released_by_a_commit(database_url: str) -> None:
    """The root-cause fact: a transaction lock cannot guard a job that commits per row."""
    first = await asyncpg.connect(asyncpg_dsn(database_url))
    second = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        transaction = first.transaction()
        await transaction.start()
        assert await first.fetchval("SELECT pg_try_advisory_xact_lock(42)")
        assert not await second.fetchval("SELECT pg_try_advisory_xact_lock(42)")
        await transaction.commit()
        async with second.transaction():
            assert await second.fetchval("SELECT pg_try_advisory_xact_lock(42)")
    finally:
        await first.close()
        await second.close()


def test_no_per_job_xact_lock_helper_exists() -> None:
    """Nobody re-adds the false guard: no transaction advisory lock anywhere in app/."""
    offenders = [
        str(path)
        for path in APP_DIR.rglob("*.py")
        if re.search(r"advisory_xact_lock", path.read_text())
    ]
    assert offenders == []


async def test_two_supervisors_on_one_database_give_exactly_one_holder(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    first = await start_scheduler(Scheduler())
    second = await start_scheduler(Scheduler())
    await first.wait_for_role(Role.LEADER, Role.STANDBY)
    await second.wait_for_role(Role.LEADER, Role.STANDBY)
    assert {first.role, second.role} == {Role.LEADER, Role.STANDBY}
    assert await holder_count(engine) == 1


async def test_released_lock_lets_a_new_holder_in(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    leader_scheduler = Scheduler()
    leader = await start_scheduler(leader_scheduler)
    await leader.wait_for_role(Role.LEADER)
    standby = await start_scheduler(Scheduler())
    await standby.wait_for_role(Role.STANDBY)
    await leader_scheduler.stop()
    await standby.wait_for_role(Role.LEADER, timeout=1)
    assert await holder_count(engine) == 1


async def test_lock_connection_terminated_loses_the_key(
    config: SchedulerConfig, engine: AsyncEngine
) -> None:
    """The seed's demotion test at the level of the lock connection."""
    lock = await LockConnection.connect(config.lock_dsn, lease_seconds=30)
    lost = asyncio.Event()
    lock.on_lost(lost.set)
    assert await lock.try_acquire()
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": lock.backend_pid})
    await asyncio.wait_for(lost.wait(), 5)
    assert not await lock.holds_lock(timeout=1)
    assert await holder_count(engine) == 0
    fresh = await LockConnection.connect(config.lock_dsn, lease_seconds=30)
    try:
        assert await fresh.try_acquire()
    finally:
        await fresh.release()
        lock.close()


async def test_leader_demotes_when_lock_connection_is_terminated(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    supervisor = await start_scheduler(Scheduler())
    await supervisor.wait_for_role(Role.LEADER)
    assert supervisor.lock is not None
    # A competitor queues for the key, so the demoted leader cannot simply win it back.
    competitor = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        waiting = asyncio.create_task(
            competitor.execute("SELECT pg_advisory_lock($1)", SCHEDULER_LEADER_KEY)
        )
        await _until_waiting(engine)
        caplog.set_level(logging.INFO, logger="app.scheduler")
        async with engine.connect() as conn:
            await conn.execute(
                text("SELECT pg_terminate_backend(:pid)"), {"pid": supervisor.lock.backend_pid}
            )
        await asyncio.wait_for(waiting, 5)
        await supervisor.wait_for_role(Role.STANDBY, timeout=5)
        assert await holder_count(engine) == 1
        assert any("scheduler.demoted" in record.getMessage() for record in caplog.records)
    finally:
        await competitor.close()


async def _until_waiting(engine: AsyncEngine) -> None:
    async def count() -> int:
        async with engine.connect() as conn:
            return int(
                (
                    await conn.execute(
                        text(
                            f"SELECT count(*) FROM pg_locks WHERE {LEADER_KEY_LOCKS}"
                            " AND NOT granted"
                        )
                    )
                ).scalar_one()
            )

    async with asyncio.timeout(5):
        while await count() == 0:
            await asyncio.sleep(0.01)


async def test_lock_loss_cancels_running_async_jobs_at_once(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    clock = FakeClock()
    scheduler = Scheduler()
    started, cancelled = asyncio.Event(), asyncio.Event()

    @scheduler.job(every(seconds=10), id="long_running")
    async def long_running(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    supervisor = await start_scheduler(scheduler, clock=clock, shutdown_grace_seconds=30)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await asyncio.wait_for(started.wait(), 10)
    assert supervisor.lock is not None
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT pg_terminate_backend(:pid)"), {"pid": supervisor.lock.backend_pid}
        )
    # Not after the 30 s shutdown grace: another leader may already be firing.
    await asyncio.wait_for(cancelled.wait(), 5)
    history = await wait_for_runs(engine, "long_running", 1)
    assert history[0][0] == "cancelled"


@pytest.mark.parametrize(
    "lookalike",
    [
        pytest.param("SELECT pg_advisory_lock(0, $1)", id="two-int4-keys"),
        pytest.param("SELECT pg_advisory_lock((5::bigint << 32) + $1)", id="bigint-high-bits"),
    ],
)
async def test_an_advisory_lock_that_only_shares_the_objid_is_not_the_leader_key(
    lookalike: str, database: Database, engine: AsyncEngine, database_url: str
) -> None:
    """pg_locks shows another key with the same objid; no reader may take it for ours."""
    other = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        await other.execute(lookalike, SCHEDULER_LEADER_KEY)
        other_pid = await other.fetchval("SELECT pg_backend_pid()")
        clock = FakeClock()
        scheduler = Scheduler()
        scheduler.job(every(seconds=10), id="fenced")(lambda ctx: None)
        store = JobStore(database.engine, pid=1, host="test")
        rows = await store.register_leader_jobs(
            scheduler.jobs.values(), clock.now(), ZoneInfo("UTC")
        )
        due = rows["fenced"].next_run_at
        claimed = await claim_slot(
            store,
            scheduler.jobs["fenced"],
            due=due,
            next_slot=due + timedelta(seconds=10),
            run_slot=due,
            now=due,
            status="running",
            fence_pid=other_pid,
            lease_seconds=30,
        )
        assert claimed is None, "the fence took a lookalike lock for the leader key"
        assert not await LockConnection(other, other_pid).holds_lock(timeout=5)
        assert (await leader(engine))["backend_pid"] is None
        assert await holder_count(engine) == 0
    finally:
        await other.close()


async def _not_firing(supervisor: Supervisor) -> bool:
    return not supervisor.firing


async def _server_seconds_pass(engine: AsyncEngine, seconds: float) -> None:
    """Return once ``seconds`` have passed by the server's clock (the lease's clock)."""
    async with engine.connect() as conn:
        start = (await conn.execute(text("SELECT clock_timestamp()"))).scalar_one()

    async def passed() -> bool:
        async with engine.connect() as conn:
            return bool(
                (
                    await conn.execute(
                        text("SELECT clock_timestamp() - :start > make_interval(secs => :seconds)"),
                        {"start": start, "seconds": seconds},
                    )
                ).scalar_one()
            )

    await eventually(passed, seconds + 10, f"{seconds} s on the server's clock")


# Three seconds of idleness and the server drops the lock connection: the lease,
# checked every half second, so a loaded machine may lag the loop by two seconds.
SHORT_LEASE: dict[str, Any] = {"lease_seconds": 3, "leader_tick_seconds": 0.5}


async def test_a_handover_grace_longer_than_the_lease_still_fires(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(seconds=1), id="after_grace")(lambda ctx: None)
    await start_scheduler(scheduler, handover_grace_seconds=5, **SHORT_LEASE)
    await wait_for_runs(engine, "after_grace", 1, timeout=20)


async def test_a_stopping_leader_keeps_the_key_until_its_body_finishes(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    first = Scheduler()
    started, finish, finished = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @first.job(every(seconds=1), id="longer_than_the_lease")
    async def longer_than_the_lease(ctx: JobContext) -> None:
        started.set()
        await finish.wait()
        finished.set()

    second = Scheduler()
    promotions: list[bool] = []

    def on_role(role: str) -> None:
        if role == "leader":
            promotions.append(finished.is_set())

    second.observe(on_role=on_role)
    leading = await start_scheduler(first, shutdown_grace_seconds=30, **SHORT_LEASE)
    await leading.wait_for_role(Role.LEADER)
    standby = await start_scheduler(second, **SHORT_LEASE)
    await standby.wait_for_role(Role.STANDBY)
    await asyncio.wait_for(started.wait(), 10)
    stopping = asyncio.create_task(first.stop())
    await _server_seconds_pass(engine, 2 * SHORT_LEASE["lease_seconds"])
    assert standby.role is Role.STANDBY, "promoted while the old leader's body still ran"
    assert await holder_count(engine) == 1
    finish.set()
    await stopping
    await standby.wait_for_role(Role.LEADER)
    assert promotions == [True]


async def test_a_stopping_leader_that_loses_its_lock_cancels_at_once(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    scheduler = Scheduler()
    started, cancelled = asyncio.Event(), asyncio.Event()

    @scheduler.job(every(seconds=1), id="endless")
    async def endless(ctx: JobContext) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    supervisor = await start_scheduler(scheduler, shutdown_grace_seconds=60)
    await asyncio.wait_for(started.wait(), 10)
    assert supervisor.lock is not None
    backend_pid = supervisor.lock.backend_pid
    stopping = asyncio.create_task(scheduler.stop())
    await eventually(lambda: _not_firing(supervisor), 5, "the stop to begin")
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend_pid})
    # Not after the 60 s grace: another worker may lead already.
    await asyncio.wait_for(cancelled.wait(), 5)
    await stopping


# How long the server may keep the queued connection of a standby that was killed: its
# client check runs every second.
_DEAD_STANDBY_SECONDS = 10


async def test_a_killed_standby_leaves_the_queue_for_the_key_within_seconds(
    config: SchedulerConfig, engine: AsyncEngine, standby_processes: StandbyProcesses
) -> None:
    """A standby waits inside pg_advisory_lock, where its backend reads nothing from the
    client: without a client check the dead connection stays queued (CLOSE-WAIT) until
    the next handover."""
    holder = await LockConnection.connect(config.lock_dsn, lease_seconds=30)
    try:
        assert await holder.try_acquire()
        standby = await standby_processes.start()
        assert await waiting_count(engine) == 1
        await standby_processes.kill(standby)
        await eventually(
            lambda: _none_waiting(engine), _DEAD_STANDBY_SECONDS, "the dead standby to leave"
        )
        assert await holder.holds_lock(timeout=5)
    finally:
        await holder.release()


async def _none_waiting(engine: AsyncEngine) -> bool:
    return await waiting_count(engine) == 0


async def test_leader_counts_only_the_standbys_that_are_alive(
    start_scheduler: StartScheduler, engine: AsyncEngine, standby_processes: StandbyProcesses
) -> None:
    leading = await start_scheduler(Scheduler())
    await leading.wait_for_role(Role.LEADER)
    survivor = await standby_processes.start()
    killed = [await standby_processes.start() for _ in range(2)]

    async def three_standbys() -> bool:
        # "waiting" is printed as the lock statement is sent; the server queues it soon.
        return bool((await leader(engine))["standbys"] == 3)

    await eventually(three_standbys, 10, "the three standbys to queue")
    for standby in killed:
        await standby_processes.kill(standby)

    async def one_standby() -> bool:
        return bool((await leader(engine))["standbys"] == 1)

    await eventually(one_standby, _DEAD_STANDBY_SECONDS, "only the live standby to count")
    assert survivor.returncode is None


async def test_the_lock_connection_probes_its_peer_with_tcp_keepalives(
    server: TestServer, database_url: str
) -> None:
    """A vanished host sends no FIN: keepalive probes from both ends find it, so the
    server drops a standby whose host vanished, and a standby whose server vanished
    stops waiting."""
    over_tcp = asyncpg_over_tcp(server, database_url)
    lock = await LockConnection.connect(over_tcp, lease_seconds=30)
    try:
        driver = lock._connection  # the driver's connection: its socket and session
        client = driver._transport.get_extra_info("socket")
        assert client.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert 0 < client.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) <= 10
        server_idle = await driver.fetchval("SELECT current_setting('tcp_keepalives_idle')::int")
        assert 0 < server_idle <= 10
    finally:
        await lock.release()


async def test_a_standby_granted_the_key_as_it_begins_to_stop_does_not_promote(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The old leader stops at the same moment (SIGTERM to every worker), so the key
    can come between a standby's stop request and the supervisor acting on the grant:
    it releases the key without leading (no promoted line, no LEADER role, no job
    rows, no services)."""
    leading_scheduler = Scheduler()
    leading = await start_scheduler(leading_scheduler)
    await leading.wait_for_role(Role.LEADER)
    stopping = Scheduler()
    stopping.job(every(seconds=1), id="only_on_the_stopping_standby")(lambda ctx: None)
    services: list[str] = []

    @stopping.service(id="never_started")
    async def never_started(ctx: ServiceContext) -> None:
        services.append(ctx.service_id)

    roles: list[str] = []
    stopping.observe(on_role=roles.append)
    granted = asyncio.Event()
    wait_acquire = LockConnection.wait_acquire

    async def granted_as_stop_begins(lock: LockConnection) -> None:
        await wait_acquire(lock)
        # Runs before the supervisor's next step: the stop request beats the grant.
        asyncio.get_running_loop().call_soon(standby.begin_stop)
        granted.set()

    monkeypatch.setattr(LockConnection, "wait_acquire", granted_as_stop_begins)
    standby = await start_scheduler(stopping)
    await standby.wait_for_role(Role.STANDBY)
    caplog.set_level(logging.INFO, logger="app.scheduler")
    caplog.clear()
    await leading_scheduler.stop()
    await asyncio.wait_for(granted.wait(), 5)
    await stopping.stop()
    assert "leader" not in roles
    assert not [r for r in caplog.records if "scheduler.promoted" in r.getMessage()]
    assert services == []
    assert await holder_count(engine) == 0
    async with engine.connect() as conn:
        rows = (await conn.execute(text("SELECT id FROM scheduler_jobs"))).scalars().all()
    assert "only_on_the_stopping_standby" not in rows
