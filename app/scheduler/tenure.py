"""One leadership's hold on the leader key: queueing for it (the host lock first, when
there is one), the handover grace, the term, checking it is still held, the shutdown
grace, and giving it back. How a leadership ended is a LeadershipEnd."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
from collections.abc import Awaitable, Callable, Set
from datetime import datetime

import asyncpg

from .clock import Clock, lease_now
from .config import SchedulerConfig
from .election import LockConnection
from .errors import ScheduleNameCollisionError
from .faults import UNREACHABLE
from .host_lock import Holder, HostLock, HostLockError
from .host_standbys import HostStandby
from .lock_target import UnsafeLockConnectionError, engine_identity
from .loop import Stop, run_loop
from .old_terms import end_old_term_transactions, lock_connection_listed
from .store import JobStore

__all__ = ["LeadershipEnd", "LockCheckError", "Tenure", "acquire_key"]

logger = logging.getLogger("app.scheduler")

# During the handover grace, how often a new leader asks whether the previous leader's
# backend has left the server.
_GONE_POLL_SECONDS = 0.05


class LeadershipEnd(enum.Enum):
    """Why a leadership ended, logged as ``scheduler.demoted``'s reason. Only an end
    that still owns the schedule is ``graceful``: its running bodies get the shutdown
    grace; after a loss another leader may already run, so they are cancelled at once."""

    STOPPED = "stopped"
    UNGUARDED_PERIOD_OVER = "unguarded period over"
    LOST_DURING_HANDOVER = "lock lost during handover"
    LOST_BEFORE_TERM = "lock lost before its term"
    CONNECTION_LOST = "lock connection lost"
    NO_LONGER_HELD = "lock no longer held"
    FAILED = "an error while leading"

    @property
    def graceful(self) -> bool:
        """True when the leader still owns the schedule as it steps down."""
        return self in (LeadershipEnd.STOPPED, LeadershipEnd.UNGUARDED_PERIOD_OVER)


class LockCheckError(Exception):
    """The server answered, but the lock statement failed (e.g. a pooling proxy)."""


async def acquire_key(
    store: JobStore,
    config: SchedulerConfig,
    clock: Clock,
    host_lock: HostLock | None,
    standby: Callable[[], Awaitable[None]],
) -> LockConnection:
    """Register the schedule's name, take the host lock (when there is one), then queue
    for the leader key on a new lock connection and return it once granted. ``standby``
    is awaited when this worker has to wait (for the host lock or for the key). Raises
    LockCheckError when the server refused the lock connection or its statements."""
    # Registered before the host lock: two names whose keys collide share its file,
    # so the second would otherwise wait on the file and never be refused.
    await store.register_schedule()
    if host_lock is not None:
        try:
            await _take_host_lock(store, config, clock, host_lock, standby)
        except HostLockError as exc:
            # The flock only spares the server lock connections: a directory another
            # user made or can write costs this worker its host lock, never its turn.
            logger.warning(
                "scheduler.host_lock_unusable: %s; queueing for the leader key in "
                "PostgreSQL without the host lock (pid=%s)",
                exc,
                os.getpid(),
                extra={"action": "scheduler.host_lock_unusable", "pid": os.getpid()},
            )
            host_lock.release()
            host_lock = None
    try:
        lock = await LockConnection.connect(
            config.lock_dsn,
            lease_seconds=config.lease_seconds,
            timeout=config.connect_timeout_seconds,
            schedule=store.schedule,
        )
    except (*UNREACHABLE, UnsafeLockConnectionError):
        raise
    except asyncpg.PostgresError as exc:
        # The server answered and refused: a wrong database name or password.
        raise LockCheckError(f"{exc.__class__.__name__}: {exc}") from exc
    if host_lock is not None:
        host_lock.queues_on(lock.backend_pid)
    try:
        await lock.check_same_database(await engine_identity(store.engine))
        if not await lock.try_acquire():
            await standby()
            logger.info(
                "scheduler.standby: waiting for the leader key (pid=%s)",
                os.getpid(),
                extra={"action": "scheduler.standby", "pid": os.getpid()},
            )
            await lock.wait_acquire()
    except (*UNREACHABLE, UnsafeLockConnectionError, ScheduleNameCollisionError):
        lock.close()
        raise
    except asyncpg.PostgresError as exc:
        lock.close()
        raise LockCheckError(f"{exc.__class__.__name__}: {exc}") from exc
    except BaseException:
        lock.close()
        raise
    if host_lock is not None:
        # The flock is the right to queue, not to lead: another worker of this host
        # now queues behind us, so that when we hang the server's end of our idle
        # lock connection hands the key to this host too (host_lock.py).
        host_lock.release()
    return lock


async def _take_host_lock(
    store: JobStore,
    config: SchedulerConfig,
    clock: Clock,
    host_lock: HostLock,
    standby: Callable[[], Awaitable[None]],
) -> None:
    """Take the host's flock, as a standby while another worker holds it; return
    without it when its holder hangs (host_lock.py). Raises HostLockError when the
    lock's directory is not safe to use."""
    if not host_lock.try_acquire():
        await standby()
        logger.info(
            "scheduler.host_standby: another worker of this host queues for the leader "
            "key; waiting for %s (pid=%s)",
            host_lock.path,
            os.getpid(),
            extra={"action": "scheduler.host_standby", "pid": os.getpid()},
        )
        # Counted as a standby while it waits, though no session of it waits for the key.
        counted = HostStandby(
            store.engine,
            schedule=store.schedule,
            host=store.host,
            pid=store.pid,
            lease_seconds=config.lease_seconds,
            timeout=config.leader_tick_seconds,
        )
        await counted.note(lease_now(clock))

        async def probe(holder: Holder) -> tuple[bool, datetime] | None:
            """Whether the host lock's holder still has its lock connection on the
            server, on the lease clock (HostLock.acquire counts a hang from it); this
            worker's standby row renewed on the way."""
            await counted.note(lease_now(clock))
            return await lock_connection_listed(
                store.engine,
                holder,
                lease_now=lease_now(clock),
                timeout=config.leader_tick_seconds,
            )

        try:
            acquired = await host_lock.acquire(
                clock,
                lease_seconds=config.lease_seconds,
                check_seconds=config.leader_tick_seconds,
                probe=probe,
            )
        finally:
            await counted.drop()
        if not acquired:
            logger.warning(
                "scheduler.host_lock_passed: the worker holding %s (pid=%s) has had no "
                "lock connection on the server for a lease (it hangs); queueing for the "
                "leader key without the host lock (pid=%s)",
                host_lock.path,
                host_lock.holder().pid,
                os.getpid(),
                extra={"action": "scheduler.host_lock_passed", "pid": os.getpid()},
            )


class Tenure:
    """One leadership's hold on the key (``lock``; None when unguarded). It owns
    ``lost``, set the moment the lock connection dies; ``stopping`` is the worker's,
    only read here."""

    def __init__(
        self,
        lock: LockConnection | None,
        *,
        store: JobStore,
        config: SchedulerConfig,
        clock: Clock,
        stopping: asyncio.Event,
    ) -> None:
        self.lock = lock
        self.store = store
        self.config = config
        self.clock = clock
        self.stopping = stopping
        self.lost = asyncio.Event()
        if lock is not None:
            lock.on_lost(self._mark_lost)

    @property
    def fence(self) -> int | None:
        """The lock connection's backend pid that every claim of this leadership is
        fenced on; None when unguarded."""
        return self.lock.backend_pid if self.lock is not None else None

    async def holds_lock(self) -> bool:
        """True unless the lock connection no longer owns the key (always when
        unguarded); the check keeps the idle connection inside its lease."""
        return self.lock is None or await self.lock.holds_lock(self.config.leader_tick_seconds)

    async def handover(self, deadline: float) -> bool:
        """The handover grace: wait until the previous leader's backend is gone, for at
        most until ``deadline`` (HANDOVER_GRACE_SECONDS on Clock.monotonic; less after
        stop()). False once the lock is lost. Services wait for the deadline whatever
        (services.run_service_after).

        The grace lets an old leader that is about to notice its loss stop before we
        fire. A leader whose backend left the server (kill -9, terminated, its lease
        ran out) cannot fire any more: the claims' fence looks for its backend in
        pg_locks and ctx.fence refuses its term once ours begins. So the grace ends the
        moment the recorded backend is gone, asked every _GONE_POLL_SECONDS (a backend
        drops its locks a moment before it leaves pg_stat_activity); while it is still
        listed (a graceful handover) the grace runs to its end, ownership checked every
        leader tick (the checks keep the idle lock connection inside its lease).
        """
        lock = self.lock
        checked = self.clock.monotonic()
        tick = self.config.leader_tick_seconds

        # Stop(True): the grace is over (run out, skipped, or a stop); Stop(False): lost.
        async def step() -> float | Stop[bool]:
            nonlocal checked
            if self.lost.is_set():
                return Stop(False)
            left = deadline - self.clock.monotonic()
            if self.stopping.is_set() or left <= 0:
                return Stop(True)
            if lock is not None:
                if await lock.previous_leader_gone(tick):
                    logger.info(
                        "scheduler.handover_skipped: the previous leader's backend is gone; "
                        "ending the handover grace (pid=%s)",
                        os.getpid(),
                        extra={"action": "scheduler.handover_skipped", "pid": os.getpid()},
                    )
                    return Stop(True)
                if self.clock.monotonic() - checked >= tick:
                    checked = self.clock.monotonic()
                    if not await lock.holds_lock(tick):
                        return Stop(False)
            return min(left, _GONE_POLL_SECONDS if lock is not None else tick)

        if not await run_loop(step, self.clock, wakes=[self.lost.wait, self.stopping.wait]):
            return False
        return lock is None or (not self.lost.is_set() and await lock.holds_lock(tick))

    async def begin_term(self, now: datetime, job_ids: list[str], service_ids: list[str]) -> bool:
        """Record this leadership and move the term, before any claim of it. The bump
        waits for the transactions that hold the leadership row (a job's fence, an old
        leader's heartbeat) for a leader tick, then ends those still there
        (old_terms.end_old_term_transactions): they belong to a process that no longer
        holds the key, hung or not, and none may commit after the new term begins. False
        when stopped meanwhile or when the key is gone."""
        lock = self.lock
        assert lock is not None, "an unguarded leadership has no term"
        recording = asyncio.ensure_future(
            lock.record_leadership(
                pid=self.store.pid,
                host=self.store.host,
                since=now,
                job_ids=job_ids,
                service_ids=service_ids,
                heartbeat_at=now if self.store.lease_clock is not None else None,
            )
        )
        tick = self.config.leader_tick_seconds
        began = self.clock.monotonic()

        async def step() -> float | Stop[bool]:
            if recording.done():
                return Stop(recording.result() is not None)
            if self.stopping.is_set() or self.lost.is_set():
                return Stop(False)
            waited = self.clock.monotonic() - began
            await end_old_term_transactions(
                self.store.engine, lock.backend_pid, waited=waited, timeout=tick
            )
            # Asked again soon: the row's next holder (several fences) shows only once
            # the one ended has let go.
            return _GONE_POLL_SECONDS

        try:
            return await run_loop(
                step,
                self.clock,
                first_delay=tick,
                wakes=[lambda: asyncio.shield(recording), self.stopping.wait, self.lost.wait],
            )
        finally:
            recording.cancel()

    async def shutdown_grace(self, bodies: Set[asyncio.Task[None]]) -> None:
        """Let running ``bodies`` (a set their owner empties as they end) finish for up
        to the shutdown grace while this worker still owns the key, checking that every
        leader tick (which keeps the lock connection inside its lease); return early
        once it is lost."""
        # The whole grace in real time, as the process manager that stops us counts it.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.shutdown_grace_seconds):
                await self._tick_while_bodies_run(bodies)

    async def _tick_while_bodies_run(self, bodies: Set[asyncio.Task[None]]) -> None:
        if not bodies:
            return

        async def check() -> float | Stop[None]:
            # Woken by the tick while bodies run and the lock was not seen lost.
            if not bodies or self.lost.is_set() or not await self.holds_lock():
                return Stop(None)
            return self.config.leader_tick_seconds

        await run_loop(
            check,
            self.clock,
            first_delay=self.config.leader_tick_seconds,
            wakes=[lambda: asyncio.wait(bodies), self.lost.wait],
        )

    async def end(self) -> None:
        """Give the key back: release it, or close a connection already lost."""
        if self.lock is None:
            return
        if self.lost.is_set():
            self.lock.close()
        else:
            await self.lock.release()

    def _mark_lost(self) -> None:
        if not self.lost.is_set():
            logger.warning(
                "scheduler.lock_lost: the lock connection died (pid=%s)",
                os.getpid(),
                extra={"action": "scheduler.lock_lost", "pid": os.getpid()},
            )
        self.lost.set()
