"""One queued lock connection per host: the workers of a host first take its flock, and
only the holder queues for the leader key in PostgreSQL; a holder promoted lets go of
it, so the leader's host also queues one standby."""

import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import Role, Scheduler
from app.scheduler.host_lock import HostLock, HostLockError
from app.scheduler.keys import SCHEDULER_LEADER_KEY
from tests.procs.cluster import Cluster

from .conftest import (
    StartScheduler,
    eventually,
    holder_count,
    one_host_queued_one,
    waiting_count,
)

LOCK_CONNECTIONS_SQL = text(
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND starts_with(application_name, 'scheduler-leader:')"
)


async def _lock_connections(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        count: int = (await conn.execute(LOCK_CONNECTIONS_SQL)).scalar_one()
        return count


def _waiting(engine: AsyncEngine, count: int) -> Callable[[], Awaitable[bool]]:
    async def queued() -> bool:
        return await waiting_count(engine) == count

    return queued


async def test_workers_sharing_a_runtime_dir_queue_one_standby_per_host(
    start_scheduler: StartScheduler, engine: AsyncEngine, tmp_path: Path
) -> None:
    """One lock connection per host, and a second on the leader's host: the flock is the
    right to queue, so a worker of the leader's host queues behind it (a hung leader is
    replaced from its own host within the lease)."""
    hosts = ["a", "a", "a", "b", "b"]
    workers = [await start_scheduler(Scheduler(), host_lock_dir=tmp_path / host) for host in hosts]
    # A worker is a standby once it queues in PostgreSQL or waits for its host's flock.
    for worker in workers:
        await worker.wait_for_role(Role.STANDBY, Role.LEADER)
    await eventually(_waiting(engine, 2), what="two standbys queued")
    assert await _lock_connections(engine) == 3
    assert await holder_count(engine) == 1


async def test_a_worker_of_the_leaders_host_queues_behind_it_and_leads_once_it_stops(
    start_scheduler: StartScheduler, engine: AsyncEngine, tmp_path: Path
) -> None:
    first_scheduler = Scheduler()
    first = await start_scheduler(first_scheduler, host_lock_dir=tmp_path)
    await first.wait_for_role(Role.LEADER)
    second = await start_scheduler(Scheduler(), host_lock_dir=tmp_path)
    await second.wait_for_role(Role.STANDBY)
    await eventually(_waiting(engine, 1), what="a standby of the host queued")
    assert await _lock_connections(engine) == 2
    await first_scheduler.stop()
    await second.wait_for_role(Role.LEADER)
    assert await _lock_connections(engine) == 1


def test_a_runtime_dir_that_cannot_hold_the_lock_file_is_refused_naming_the_setting(
    tmp_path: Path,
) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    lock = HostLock.for_key(not_a_directory, "postgresql://db", SCHEDULER_LEADER_KEY)
    with pytest.raises(HostLockError, match=r"REGENT_RUNTIME_DIR .* HOST_LOCK_ENABLED=false"):
        lock.try_acquire()


def test_killing_a_hosts_queued_worker_queues_another_of_that_host(one_host: Cluster) -> None:
    one_host.wait_for(lambda: one_host_queued_one(one_host), 30, "one worker queued")
    assert one_host.lock_connections() == 1
    [queued] = one_host.queued()
    os.kill(queued, signal.SIGKILL)
    one_host.wait_for(
        lambda: one_host.queued() not in ([], [queued]), 5, "another worker of the host queued"
    )
    # The dead worker's backend waits in pg_advisory_lock until the server's client
    # check finds its socket closed.
    one_host.wait_for(
        lambda: one_host.lock_connections() == 1, 10, "the dead worker's backend to leave"
    )
    assert len(one_host.queued()) == 1
