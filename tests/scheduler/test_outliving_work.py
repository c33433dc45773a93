"""Work that outlives its cancellation: one rule for job bodies and services.

A thread cannot be cancelled. A service, or an async job body, that does its blocking
work in ``asyncio.to_thread`` is cancelled on a step-down while that thread runs on.
The run holds its running lease (a service copy on its own row, a job run on the job's
row) until its task and every thread it started ended, renewed meanwhile, so no new
leader starts another copy beside it; when its process died, until the lease ran out.

Each test asserts the invariant (two copies never ran at once), not the order of log
lines.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from datetime import UTC, datetime

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, JobContext, Role, Scheduler, ServiceContext, every

from ..procs.cluster import Cluster
from ..procs.gated_app import GATE_KEY
from .conftest import (
    SERVICE_LEASE_SECONDS,
    CopiesInThreads,
    StartScheduler,
    eventually,
    wait_for_runs,
    wait_for_runs_past_busy_rows,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# Long enough that no clock step in these tests outruns a running lease by itself.
LEASE = 30


def _service_in_thread(copies: CopiesInThreads, label: str) -> Scheduler:
    scheduler = Scheduler()

    @scheduler.service(id="consumer", name="Consumer")
    async def consumer(ctx: ServiceContext) -> None:
        await copies.run_one(label)
        await asyncio.Event().wait()

    return scheduler


def _async_job_in_thread(copies: CopiesInThreads, label: str) -> Scheduler:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="blocking_step", name="Blocking step")
    async def blocking_step(ctx: JobContext) -> None:
        await copies.run_one(label)

    return scheduler


def _logged(caplog: pytest.LogCaptureFixture, action: str) -> bool:
    return any(getattr(record, "action", None) == action for record in caplog.records)


async def test_no_new_leader_starts_a_service_while_the_previous_copys_thread_runs(
    start_scheduler: StartScheduler,
    copies_in_threads: CopiesInThreads,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock(T0)
    copies = copies_in_threads
    old_scheduler = _service_in_thread(copies, "old")
    old = await start_scheduler(old_scheduler, clock=clock, lease_seconds=LEASE)
    await old.wait_until_firing()
    await copies.in_thread()
    new = await start_scheduler(_service_in_thread(copies, "new"), clock=clock, lease_seconds=LEASE)
    await new.wait_for_role(Role.STANDBY)
    # A graceful step-down: the old copy's task is cancelled, its thread runs on.
    await old_scheduler.stop()
    await new.wait_until_firing()

    async def new_copy_started_or_waits() -> bool:
        return "new" in copies.labels() or _logged(caplog, "service.waiting_for_previous_copy")

    await eventually(new_copy_started_or_waits, what="the new leader's copy, or its wait")
    copies.release.set()

    async def new_copy_started() -> bool:
        return copies.labels() == ["old", "new"]

    # Released: the new copy starts at once, though the (fake) clock stands still.
    await eventually(new_copy_started, what="the new leader's copy")
    assert copies.overlaps() == []


async def test_an_async_job_bodys_thread_holds_the_running_lease_after_a_step_down(
    start_scheduler: StartScheduler, engine: AsyncEngine, copies_in_threads: CopiesInThreads
) -> None:
    clock = FakeClock(T0)
    copies = copies_in_threads
    old_scheduler = _async_job_in_thread(copies, "old")
    old = await start_scheduler(
        old_scheduler, clock=clock, lease_seconds=LEASE, shutdown_grace_seconds=0
    )
    await old.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await copies.in_thread()
    new = await start_scheduler(
        _async_job_in_thread(copies, "new"), clock=clock, lease_seconds=LEASE
    )
    await new.wait_for_role(Role.STANDBY)
    # The body is cancelled at once (no shutdown grace); its thread runs on.
    await old_scheduler.stop()
    await new.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    # The claim may meet the job row held for a moment by the old body's lease renewal
    # (both woken by this step): the new leader's timer and tick, the old renewer.
    history = await wait_for_runs_past_busy_rows(engine, clock, "blocking_step", 2, sleepers=3)
    assert [status for status, _ in history] == ["cancelled", "skipped_overlap"]
    copies.release.set()

    async def lease_released() -> bool:
        return "blocking_step" not in await _leased_jobs(engine)

    await eventually(lease_released, what="the running lease released as the thread ended")
    clock.advance(10)
    history = await wait_for_runs(engine, "blocking_step", 3)
    assert [status for status, _ in history] == ["cancelled", "skipped_overlap", "ok"]
    assert copies.overlaps() == []


async def test_an_async_job_bodys_thread_holds_the_running_lease_past_its_timeout(
    start_scheduler: StartScheduler, engine: AsyncEngine, copies_in_threads: CopiesInThreads
) -> None:
    clock = FakeClock(T0)
    copies = copies_in_threads
    scheduler = Scheduler()

    @scheduler.job(every(seconds=10), id="blocking_step", timeout=0.2)
    async def blocking_step(ctx: JobContext) -> None:
        await copies.run_one(f"run {len(copies.copies) + 1}")

    supervisor = await start_scheduler(scheduler, clock=clock, lease_seconds=LEASE)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    clock.advance(10)
    await copies.in_thread()
    # The body is cancelled by its timeout (real time); its thread runs on.
    await wait_for_runs(engine, "blocking_step", 1)
    # The timer, the tick and the thread's lease renewer park before the clock moves;
    # the claim may meet the job row held for a moment by that renewal.
    await clock.wait_for_sleepers(3)
    clock.advance(10)
    history = await wait_for_runs_past_busy_rows(engine, clock, "blocking_step", 2, sleepers=3)
    assert [status for status, _ in history] == ["timeout", "skipped_overlap"]
    copies.release.set()

    async def lease_released() -> bool:
        return "blocking_step" not in await _leased_jobs(engine)

    await eventually(lease_released, what="the running lease released as the thread ended")
    clock.advance(10)
    await copies.in_thread()
    assert copies.overlaps() == []


async def test_a_crashed_service_restarts_only_once_its_crashed_copys_threads_ended(
    start_scheduler: StartScheduler,
    copies_in_threads: CopiesInThreads,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    clock = FakeClock(T0)
    copies = copies_in_threads
    scheduler = Scheduler()

    strays: list[asyncio.Future[None]] = []

    @scheduler.service(id="consumer", name="Consumer")
    async def consumer(ctx: ServiceContext) -> None:
        if not copies.copies:
            # Leaves its blocking step running in a task of its own, and crashes.
            strays.append(asyncio.ensure_future(copies.run_one("crashed")))
            await copies.in_thread()
            raise RuntimeError("the consumer crashed")
        await copies.run_one("restarted")
        await asyncio.Event().wait()

    await start_scheduler(scheduler, clock=clock, lease_seconds=LEASE)

    async def crashed() -> bool:
        return any("crashed; restarting" in record.getMessage() for record in caplog.records)

    await eventually(crashed, what="the first copy's crash")
    # Parked: the leader tick, the service lease's renewal and the restart's backoff.
    await clock.wait_for_sleepers(3)
    clock.advance(60)

    async def restart_began_or_waits() -> bool:
        return "restarted" in copies.labels() or _logged(caplog, "service.waiting_for_its_threads")

    await eventually(restart_began_or_waits, what="the restart, or its wait")
    copies.release.set()

    async def restarted() -> bool:
        return copies.labels() == ["crashed", "restarted"]

    await eventually(restarted, what="the restarted copy")
    assert copies.overlaps() == []


async def _leased_jobs(engine: AsyncEngine) -> set[str]:
    """The jobs whose row holds a running lease."""
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT id FROM scheduler_jobs WHERE running_run_id IS NOT NULL")
        )
        return {row.id for row in rows}


def _first_copy_owner(cluster: Cluster) -> int:
    return int(cluster.query("SELECT pid FROM service_copies ORDER BY id LIMIT 1")[0][0])


def _copies_by_others(cluster: Cluster, owner: int) -> list[tuple[object, ...]]:
    return cluster.query(
        "SELECT extract(epoch FROM began_at) FROM service_copies WHERE pid <> %s ORDER BY id",
        owner,
    )


def _copies_at_once(cluster: Cluster) -> list[tuple[object, ...]]:
    """Pairs of copies where the later began while the earlier's thread still ran."""
    return cluster.query(
        "SELECT a.id, b.id FROM service_copies a JOIN service_copies b ON a.id < b.id"
        " AND b.began_at < coalesce(a.thread_ended_at, 'infinity')"
    )


def _release_and_see_the_next_copy(
    cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]], owner: int
) -> None:
    gate.execute("SELECT pg_advisory_unlock(%s)", (GATE_KEY,))
    cluster.wait_for(lambda: _copies_by_others(cluster, owner), 10, "a copy on another process")
    cluster.processes[owner].wait(10)
    assert _copies_at_once(cluster) == []


@pytest.mark.multiprocess
def test_after_a_kill_9_the_service_starts_once_the_dead_copys_lease_runs_out(
    service_cluster: Cluster,
) -> None:
    cluster = service_cluster
    owner = _first_copy_owner(cluster)
    killed = time.time()
    os.kill(owner, signal.SIGKILL)
    cluster.wait_for(
        lambda: _copies_by_others(cluster, owner),
        SERVICE_LEASE_SECONDS + 10,
        "a copy on another process",
    )
    began = float(_copies_by_others(cluster, owner)[0][0])  # type: ignore[arg-type]
    # The dead copy renewed its lease every third of it: the next copy waited out at
    # least the rest (a third, whatever the renewal's lag), then no more than a tick
    # (1 s) and the time a start takes.
    assert began >= killed + SERVICE_LEASE_SECONDS / 3
    assert began <= killed + SERVICE_LEASE_SECONDS + 1 + 3


@pytest.mark.multiprocess
def test_no_new_leader_starts_the_service_while_a_sigtermed_leaders_copy_runs_its_thread(
    service_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    """A rolling deploy: SIGTERM to the leader while its copy's thread waits. The app's
    shutdown waits for the thread with the copy's lease renewed; the next leader starts
    its copy only once that thread ended."""
    cluster = service_cluster
    owner = _first_copy_owner(cluster)
    os.kill(owner, signal.SIGTERM)
    cluster.wait_for(lambda: cluster.holders() not in ([], [owner]), 10, "a new leader")
    successor = cluster.holders()[0]
    cluster.wait_for(
        lambda: (
            _copies_by_others(cluster, owner)
            or "service.waiting_for_previous_copy" in cluster.log_of(successor)
        ),
        10,
        "the new leader's copy, or its wait",
    )
    _release_and_see_the_next_copy(cluster, gate, owner)


@pytest.mark.multiprocess
def test_a_service_thread_keeps_its_lease_when_its_owners_event_loop_ends_before_it(
    service_cluster: Cluster, gate: psycopg.Connection[tuple[object, ...]]
) -> None:
    """Ctrl-C twice: the second stops the shutdown's wait for the thread and the event
    loop ends (asyncio.run cancels every task) while the copy's thread runs. The lease
    is then renewed from a thread, and released by the copy's last thread as it ends."""
    cluster = service_cluster
    owner = _first_copy_owner(cluster)
    os.kill(owner, signal.SIGINT)
    cluster.wait_for(
        lambda: "scheduler.waiting_for_threads" in cluster.log_of(owner), 10, "the wait"
    )
    os.kill(owner, signal.SIGINT)
    cluster.wait_for(
        lambda: "Application shutdown complete" in cluster.log_of(owner), 10, "the lifespan's end"
    )
    ended = time.time()
    # The loop's last renewal came before its end: a lease nobody renewed since has run
    # out a lease later, and a new leader would have started its copy within a tick.
    cluster.wait_for(
        lambda: cluster.query(
            "SELECT 1 FROM scheduler_leadership WHERE pid <> %s"
            " AND heartbeat_at > to_timestamp(%s)",
            owner,
            ended + SERVICE_LEASE_SECONDS + 2,
        ),
        SERVICE_LEASE_SECONDS + 20,
        "a new leader's heartbeat a lease and two ticks later",
    )
    assert _copies_by_others(cluster, owner) == []
    _release_and_see_the_next_copy(cluster, gate, owner)
