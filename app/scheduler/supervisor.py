"""The per-worker task: standby <-> leader.

    start --> STANDBY --(key granted)--> LEADER --(lost | stop)--> STANDBY / STOPPED
                 |                          ^
                 +--(lock-check error, not production)--> UNGUARDED (one backoff period)

STANDBY waits inside ``pg_advisory_lock`` on its own lock connection, so the server
wakes it the moment the key is released. Before anything else a worker registers its
schedule's name (a name whose key collides with another's is refused there, never
left waiting on the host lock file the two keys share). With a host lock
(``host_lock_dir``), a worker then takes its host's flock: until then it is a STANDBY with no lock
connection, and only the flock holder queues in PostgreSQL; promoted, it lets go of the
flock so that another worker of its host queues behind it (host_lock.py). LEADER waits
HANDOVER_GRACE_SECONDS (less once the previous leader's backend is gone), then fires
every leader-only job from one timer (a heap keyed by when each job is next due: one
wake claims every job due by then in one statement) and runs one task per service,
started only once the whole grace has passed (a service has no fence) and no other
copy of it holds the service's running lease (a copy whose thread outlived its
leadership, or a dead one's until it runs out), and checks every
LEADER_TICK_SECONDS that its lock connection still owns the key, through the handover
and shutdown graces too (the check is what keeps the idle connection inside its
lease). The termination listener of that connection demotes at once; the fence in
every slot claim makes a leader that lost the key unable to claim anything even before
it notices. Before its first claim, a leader begins its term on the lock connection,
after the fenced job commits of older terms that are under way. UNGUARDED fires jobs
but starts no service.

A stopping worker never promotes: once begin_stop() (or stop()) is called, a standby's
wait is cancelled, and a key granted in the same instant is released at once, with no
promoted line, no LEADER role, no job rows and no services. The app calls
begin_stop() on SIGTERM and SIGINT (app/stop_signal.py), not only at the lifespan's
shutdown, because every worker stopping at once would otherwise hand the key to a
standby that is itself on its way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
from collections.abc import Awaitable
from dataclasses import replace
from datetime import datetime, timedelta

import asyncpg

from .ahead import CommitCost, collector_held_off
from .broken import BrokenJobs
from .clock import Clock, ServerClock, lease_now
from .config import Role, SchedulerConfig
from .election import (
    LockConnection,
    UnsafeLockConnectionError,
    engine_identity,
    lock_connection_listed,
)
from .errors import JobRowBusyError, ScheduleNameCollisionError
from .faults import UNREACHABLE, blames_job, database_answers, is_busy_row
from .host_lock import Holder, HostLock, HostLockError
from .registry import JobSpec, Registry, ServiceSpec
from .replicas import run_replica_jobs
from .retry import BROKEN_JOB, BUSY_ROW, DATABASE, log_retry
from .runner import Claim, Due, Runner
from .store import JobStore
from .store.leases import HeldLease
from .store.prepared import PreparedClaimDropped, PreparedCommit
from .store.registration import LeaderRow
from .store.rows import JobRow
from .store.runs import format_error
from .store.schedule import LeaderJobs
from .timetable import Timetable
from .triggers import Trigger

__all__ = ["LeadershipEnd", "Supervisor"]

logger = logging.getLogger("app.scheduler")

# A lock-check error is a set-up problem that rarely clears by itself: outside
# production, fire unguarded this long between checks.
_FAIL_OPEN_SECONDS = 60.0
# During the handover grace, how often a new leader asks whether the previous leader's
# backend has left the server.
_GONE_POLL_SECONDS = 0.05
# A registration that inserts at least this many job rows, more than the schedule held,
# has the planner count them (Supervisor._refresh_statistics); for fewer, a claim that
# reads every row costs about what its index probes would.
_GREW_ROWS = 1000


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


class _LockCheckError(Exception):
    """The server answered, but the lock statement failed (e.g. a pooling proxy)."""


class Supervisor:
    """Elects, leads and demotes for one worker; ``run()`` is its whole life."""

    def __init__(
        self,
        registry: Registry,
        runner: Runner,
        store: JobStore,
        config: SchedulerConfig,
        clock: Clock,
    ) -> None:
        self.registry = registry
        self.runner = runner
        self.store = store
        self.config = config
        self._claim_ahead = timedelta(seconds=config.claim_ahead_seconds)
        self._committing = CommitCost()
        # A prepared claim under way that has not begun to commit (a step-down rolls it back).
        self._uncommitted = False
        self.clock = clock
        self.role = Role.STARTING
        self.lock: LockConnection | None = None
        self._role_changed = asyncio.Condition()
        self._stopping = asyncio.Event()
        self._lost = asyncio.Event()
        # When this leadership next acts on each leader job (one timer for them all).
        self._timetable = Timetable()
        # Jobs whose claim is under way, and those of them whose row the tick's reload
        # found changed meanwhile (read again once the claim is in).
        self._claiming: set[str] = set()
        self._changed_while_claiming: set[str] = set()
        self._acquiring: asyncio.Task[LockConnection] | None = None
        self._rows: dict[str, JobRow] = {}
        # Where the tick's next look for rows changed by others starts (store.changed_rows).
        self._horizon = "0"
        # Jobs whose row a read after their claim could not read again: the horizon may
        # have moved past what changed them, so the next tick reads them by id.
        self._unread: set[str] = set()
        self._bodies: set[asyncio.Task[None]] = set()
        self._failures = 0
        self._reload = asyncio.Event()
        self._firing = asyncio.Event()
        self._broken = BrokenJobs(store, clock)
        # Jobs whose last claims met their row held elsewhere, and how many in a row.
        self._busy: dict[str, int] = {}
        self.refusal: str | None = None
        # Ids of the leader-only jobs and the services of this worker that the live
        # leader of its schedule does not run (another app of the same name leads):
        # they run nowhere.
        self.unled_jobs: list[str] = []
        self._host_lock = (
            HostLock.for_key(config.host_lock_dir, config.lock_dsn, store.key.host_lock_id)
            if config.host_lock_dir is not None
            else None
        )

    @property
    def leader_jobs(self) -> list[JobSpec]:
        """The jobs only the leader fires."""
        return [spec for spec in self.registry.jobs.values() if spec.leader_only]

    @property
    def replica_jobs(self) -> list[JobSpec]:
        """The jobs every worker fires."""
        return [spec for spec in self.registry.jobs.values() if not spec.leader_only]

    @property
    def firing(self) -> bool:
        """True while this worker leads with its job timer running; False from the moment
        it starts to step down."""
        return self._firing.is_set()

    @property
    def running_job_ids(self) -> set[str]:
        """Ids of the jobs whose body runs in this process now, even one whose thread
        outlived a leadership."""
        return self.runner.running_job_ids

    async def run(self) -> None:
        """Elect and lead until stop(); never raises but CancelledError."""
        replicas = asyncio.create_task(
            run_replica_jobs(
                self.replica_jobs,
                store=self.store,
                runner=self.runner,
                clock=self.clock,
                zone=self.config.zone,
                broken=self._broken,
            ),
            name="replica-jobs",
        )
        watch = asyncio.create_task(self._watch_leader_jobs(), name="leader-jobs-watch")
        follow = asyncio.create_task(self._follow_server_clock(), name="server-clock")
        try:
            while not self._stopping.is_set():
                await self.run_once()
        finally:
            for task in (replicas, watch, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._host_lock is not None:
                self._host_lock.release()
            await self._set_role(Role.STOPPED)

    async def run_once(self) -> None:
        """One pass: become leader (or fail open, or back off), lead until that ends."""
        try:
            self._acquiring = asyncio.ensure_future(self._acquire())
            lock = await self._acquiring
        except asyncio.CancelledError:
            if self._stopping.is_set():
                return
            raise
        except UNREACHABLE as exc:
            await self._back_off("scheduler.lock_unreachable", exc)
            return
        except (UnsafeLockConnectionError, ScheduleNameCollisionError) as exc:
            # A set-up error, not a passing fault: stop, loudly; the API keeps serving.
            logger.error(
                "scheduler.refused: %s (pid=%s)",
                exc,
                os.getpid(),
                extra={"action": "scheduler.refused", "pid": os.getpid()},
            )
            self.refusal = str(exc)
            self._stopping.set()
            return
        except _LockCheckError as exc:
            if self._stopping.is_set():
                return
            if self.config.fail_closed:
                await self._back_off("scheduler.fail_closed", exc)
                return
            logger.warning(
                "scheduler.fail_open: the lock check failed (%s); firing unguarded for %s s "
                "before checking again; slot claims still fire each slot once",
                exc,
                _FAIL_OPEN_SECONDS,
                extra={"action": "scheduler.fail_open", "pid": os.getpid()},
            )
            until = self.clock.now() + timedelta(seconds=_FAIL_OPEN_SECONDS)
            await self._lead(None, until=until)
            return
        finally:
            self._acquiring = None
        if self._stopping.is_set():
            # The key came as this worker began to stop (the old leader stopping at the
            # same moment): leading now would promote and demote at once, so the key
            # goes straight back to whoever waits next.
            await lock.release()
            return
        failure = await self._lead(lock)
        if failure is None:
            self._failures = 0
        elif not self._stopping.is_set():
            # A leadership that could not start (a read-only database, a missing
            # migration) would otherwise be retried as fast as the server answers.
            await self._back_off("scheduler.leading_failed", failure)

    async def stop(self) -> None:
        """Stop firing; wait up to the shutdown grace for running jobs; release the key."""
        self.begin_stop()

    def begin_stop(self) -> None:
        """Ask this worker to stop, from any callback on the loop (a signal handler's
        call_soon too), and return at once: from now on it never promotes, and a
        standby waiting for the key stops waiting."""
        self._stopping.set()
        if self._acquiring is not None:
            self._acquiring.cancel()

    async def wait_until_firing(self, timeout: float = 10) -> None:
        """Return once this worker leads with its job rows registered and timer running."""
        async with asyncio.timeout(timeout):
            await self._firing.wait()

    async def wait_for_role(self, *roles: Role, timeout: float = 10) -> Role:
        """Return the role once it is one of ``roles``; for tests and the admin view."""
        async with asyncio.timeout(timeout), self._role_changed:
            await self._role_changed.wait_for(lambda: self.role in roles)
            return self.role

    async def _acquire(self) -> LockConnection:
        # Registered before the host lock: two names whose keys collide share its file,
        # so the second would otherwise wait on the file and never be refused.
        await self.store.register_schedule()
        if self._host_lock is not None:
            try:
                await self._take_host_lock(self._host_lock)
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
                self._host_lock.release()
                self._host_lock = None
        try:
            lock = await LockConnection.connect(
                self.config.lock_dsn,
                lease_seconds=self.config.lease_seconds,
                timeout=self.config.connect_timeout_seconds,
                schedule=self.store.schedule,
            )
        except (*UNREACHABLE, UnsafeLockConnectionError):
            raise
        except asyncpg.PostgresError as exc:
            # The server answered and refused: a wrong database name or password.
            raise _LockCheckError(f"{exc.__class__.__name__}: {exc}") from exc
        if self._host_lock is not None:
            self._host_lock.queues_on(lock.backend_pid)
        try:
            await lock.check_same_database(await engine_identity(self.store.engine))
            if not await lock.try_acquire():
                await self._set_role(Role.STANDBY)
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
            raise _LockCheckError(f"{exc.__class__.__name__}: {exc}") from exc
        except BaseException:
            lock.close()
            raise
        if self._host_lock is not None:
            # The flock is the right to queue, not to lead: another worker of this host
            # now queues behind us, so that when we hang the server's end of our idle
            # lock connection hands the key to this host too (host_lock.py).
            self._host_lock.release()
        return lock

    async def _take_host_lock(self, host_lock: HostLock) -> None:
        """Take the host's flock, as a STANDBY while another worker holds it; return
        without it when its holder hangs (host_lock.py). Raises HostLockError."""
        if not host_lock.try_acquire():
            await self._set_role(Role.STANDBY)
            logger.info(
                "scheduler.host_standby: another worker of this host queues for the leader "
                "key; waiting for %s (pid=%s)",
                host_lock.path,
                os.getpid(),
                extra={"action": "scheduler.host_standby", "pid": os.getpid()},
            )
            if not await host_lock.acquire(
                self.clock,
                lease_seconds=self.config.lease_seconds,
                check_seconds=self.config.leader_tick_seconds,
                probe=self._probe_host_lock_holder,
            ):
                logger.warning(
                    "scheduler.host_lock_passed: the worker holding %s (pid=%s) has had no "
                    "lock connection on the server for a lease (it hangs); queueing for the "
                    "leader key without the host lock (pid=%s)",
                    host_lock.path,
                    host_lock.holder().pid,
                    os.getpid(),
                    extra={"action": "scheduler.host_lock_passed", "pid": os.getpid()},
                )

    async def _probe_host_lock_holder(self, holder: Holder) -> tuple[bool, datetime] | None:
        """Whether the host lock's holder still has its lock connection on the server,
        on the lease clock (HostLock.acquire counts a hang from it)."""
        return await lock_connection_listed(
            self.store.engine,
            holder,
            lease_now=lease_now(self.clock),
            timeout=self.config.leader_tick_seconds,
        )

    async def _lead(
        self, lock: LockConnection | None, *, until: datetime | None = None
    ) -> BaseException | None:
        """Lead until the lock is lost, stop() or ``until``. Returns the error that
        ended a leadership before it fired (its caller backs off), else None."""
        self._lost.clear()
        self.lock = lock
        if lock is not None:
            lock.on_lost(self._mark_lost)
        await self._set_role(Role.LEADER if lock is not None else Role.UNGUARDED)
        logger.info(
            "scheduler.promoted (pid=%s, lock_backend_pid=%s)",
            os.getpid(),
            lock.backend_pid if lock else None,
            extra={"action": "scheduler.promoted", "pid": os.getpid()},
        )
        loops: list[asyncio.Task[None]] = []
        end = LeadershipEnd.STOPPED
        fired, failure = False, None
        try:
            grace_ends = self.clock.now() + timedelta(seconds=self.config.handover_grace_seconds)
            if not await self._handover(lock, grace_ends):
                end = LeadershipEnd.LOST_DURING_HANDOVER
                return None
            if self._stopping.is_set():
                return None
            now = self.clock.now()
            if lock is not None and not await self._begin_term(lock, now):
                end = (
                    LeadershipEnd.STOPPED
                    if self._stopping.is_set()
                    else LeadershipEnd.LOST_BEFORE_TERM
                )
                return None
            grew = await self._register(now)
            if lock is not None:
                await lock.on_wake(self._reload.set)
            fence = lock.backend_pid if lock else None
            timer = asyncio.create_task(self._timer(fence), name="leader-jobs-timer")
            loops = [timer]
            if lock is not None:
                # Services (long-poll consumers) run on one process at most: never
                # unguarded, where another worker may lead.
                loops += [
                    asyncio.create_task(
                        self._service_after(spec, grace_ends, lock), name=f"service:{spec.id}"
                    )
                    for spec in self.registry.services.values()
                ]
            if grew:
                # Beside the timer and the tick, neither of which it may hold up.
                loops.append(
                    asyncio.create_task(self._refresh_statistics(), name="leader-jobs-analyze")
                )
            self._firing.set()
            fired = True
            ticking = asyncio.ensure_future(self._tick_until_done(lock, until, timer))
            # A tick's statements may wait on the database (a row lock, the pool): a lost
            # lock connection ends the leadership without waiting for them, since the
            # next leader starts its services once its grace is over.
            lost = await _first(ticking, self._lost.wait()) == 1
            end = LeadershipEnd.CONNECTION_LOST if lost else ticking.result()
        except Exception as exc:
            # The database went away while registering (a job's own fault only marks
            # that job broken): without the job rows we cannot lead.
            logger.warning("scheduler: leading failed", exc_info=True)
            end = LeadershipEnd.FAILED
            failure = None if fired else exc
        finally:
            await self._step_down(lock, loops, end)
        return failure

    async def _begin_term(self, lock: LockConnection, now: datetime) -> bool:
        """Record this leadership and move the term, before any claim of it. The bump
        waits for the job transactions a fence holds; False when stopped meanwhile or
        when the key is gone."""
        recording = asyncio.ensure_future(
            lock.record_leadership(
                pid=self.store.pid,
                host=self.store.host,
                since=now,
                job_ids=[spec.id for spec in self.leader_jobs],
                service_ids=list(self.registry.services),
                heartbeat_at=now if self.store.lease_clock is not None else None,
            )
        )
        if await _first(recording, self._stopping.wait(), self._lost.wait()) != 0:
            return False
        return recording.result() is not None

    async def _register(self, now: datetime) -> bool:
        """Read every job row of the schedule, and upsert in one statement the rows of
        the leader jobs that are not stored as registered (no row, another trigger or
        name, not leader-only): a failover over unchanged jobs writes nothing. When that
        statement fails for a job's fault, each row is written in its own commit
        instead, so the job whose row or first slot cannot be handled is marked broken
        (its loop retries it) and every other job registers; a database that does not
        answer fails the whole leadership, to be retried. Clears the broken marks of
        the jobs registered. The read's horizon is where the first tick's look for
        changes starts. True when it inserted at least _GREW_ROWS rows, more than the
        schedule held."""
        self._rows = {}
        self._unread.clear()
        specs = {spec.id: spec for spec in self.leader_jobs}
        stored = await self.store.stored_jobs()
        self._horizon = stored.horizon
        rows: list[LeaderRow] = []
        first_slots: dict[Trigger, datetime] = {}
        for spec in specs.values():
            held = stored.jobs.get(spec.id)
            try:
                trigger = spec.trigger.describe()
                if (
                    held is not None
                    and held.leader_only
                    and held.trigger == trigger
                    and held.name == spec.name
                ):
                    # Stored as registered: nothing to write, and its state is the one read.
                    self._rows[spec.id] = held.row
                    continue
                rows.append(
                    LeaderRow.of(
                        spec,
                        now,
                        self.config.zone,
                        stored_trigger=None if held is None else held.trigger,
                        first_slots=first_slots,
                    )
                )
            except Exception as exc:
                await self._blame(spec.id, exc)
        try:
            written = await self.store.upsert_leader_rows(rows)
            self._rows |= written
            # Rows given without slots whose stored row changed since it was read.
            changed = [specs[row.id] for row in rows if row.id not in written]
            self._rows |= await self.store.register_leader_jobs(changed, now, self.config.zone)
        except Exception as exc:
            if not await blames_job(self.store.engine, exc):
                raise
            logger.warning(
                "scheduler.register_one_by_one: the set registration of %s jobs failed (%s); "
                "registering each in its own commit",
                len(rows),
                exc.__class__.__name__,
                extra={"action": "scheduler.register_one_by_one", "pid": os.getpid()},
            )
            for row in rows:
                if row.id in self._rows:
                    continue
                try:
                    # With its slots: the stored row read above may have changed since.
                    self._rows[row.id] = await self.store.register_leader_job(
                        specs[row.id], now, self.config.zone
                    )
                except Exception as row_exc:
                    await self._blame(row.id, row_exc)
        repaired = (stored.broken | self._broken.ids) & self._rows.keys()
        if repaired:
            await self._broken.repaired(sorted(repaired))
        inserted = sum(1 for row in rows if row.id in self._rows and row.id not in stored.jobs)
        return inserted >= _GREW_ROWS and inserted > len(stored.jobs)

    async def _refresh_statistics(self) -> None:
        """Have the planner count the job rows a registration just inserted. Until the
        autovacuum's analyze (up to a minute later) it plans for the rows the table
        held, and its plan of the slot claim reads every job row of the schedule at
        each fire: with 10,000 new jobs, each fire of the first minute after a first
        boot waited on a scan of them all. Never raises."""
        try:
            await self.store.analyze()
        except Exception:
            logger.warning("scheduler: could not analyze the job rows", exc_info=True)

    async def _blame(self, job_id: str, exc: BaseException) -> None:
        """Mark the job broken for ``exc``; re-raise it when the database does not
        answer (an outage, not the job's fault). A row another transaction holds is
        neither: the job is left unregistered, and the timer registers it once the row
        is free (_register_late)."""
        if is_busy_row(exc):
            return
        if not await blames_job(self.store.engine, exc):
            raise exc
        await self._broken.mark(job_id, format_error(exc))

    async def _tick_until_done(
        self,
        lock: LockConnection | None,
        until: datetime | None,
        timer: asyncio.Task[None],
    ) -> LeadershipEnd:
        while True:
            woken = await _first(
                self.clock.sleep(self.config.leader_tick_seconds),
                self._lost.wait(),
                self._stopping.wait(),
                self._reload.wait(),
            )
            self._reload.clear()
            if woken in (1, 2):
                return (
                    LeadershipEnd.CONNECTION_LOST if self._lost.is_set() else LeadershipEnd.STOPPED
                )
            if until is not None and self.clock.now() >= until:
                return LeadershipEnd.UNGUARDED_PERIOD_OVER
            if lock is not None and not await lock.holds_lock(self.config.leader_tick_seconds):
                return LeadershipEnd.NO_LONGER_HELD
            # Pick up what others changed (pause, resume, run now) since the last tick,
            # reading only the rows changed since, reap the running leases whose
            # owners died, and say that we still fire.
            # The jobs a read after a claim could not read again are read by id: what
            # changed them may lie behind the horizon already.
            try:
                unread = set(self._unread)
                rows = await self.store.load(unread) if unread else {}
                changed = await self.store.changed_rows(self._horizon)
                self._unread -= unread
                for job_id, row in (rows | changed.rows).items():
                    if job_id in self._rows and self._rows[job_id] != row:
                        self._rows[job_id] = row
                        self._row_changed(job_id)
                        if row.paused:
                            # A body claimed ahead of its slot does not begin once
                            # the pause is seen.
                            self.runner.drop_for_pause(job_id)
                self._horizon = changed.horizon
                for job_id in await self.store.reap(self.clock.now(), self.runner.renewing):
                    logger.warning(
                        "job.abandoned: the running lease of job %s ran out (its owner died)",
                        job_id,
                        extra={"action": "job.abandoned", "job_id": job_id},
                    )
                if lock is not None:
                    await self.store.heartbeat(lock.backend_pid, self.clock.now())
            except Exception:
                logger.warning("scheduler: could not reload the job rows", exc_info=True)
                continue
            if timer.done():
                # A bug, not a passing fault (a wake's failure is retried): no leader
                # job fires for the rest of this leadership, so each is marked broken
                # (health says so) until a later registration or claim of it succeeds.
                death = _loop_death(timer)
                for spec in self.leader_jobs:
                    if spec.id not in self._broken:
                        await self._broken.mark(spec.id, death)

    async def _step_down(
        self, lock: LockConnection | None, loops: list[asyncio.Task[None]], end: LeadershipEnd
    ) -> None:
        self._firing.clear()
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        if self._bodies:
            if end.graceful:
                await self._shutdown_grace(lock)
            for task in self._bodies:
                task.cancel()
            await asyncio.gather(*self._bodies, return_exceptions=True)
            self._bodies.clear()
        if lock is not None:
            if self._lost.is_set():
                lock.close()
            else:
                await lock.release()
        self.lock = None
        logger.info(
            "scheduler.demoted (pid=%s, reason=%s)",
            os.getpid(),
            end.value,
            extra={"action": "scheduler.demoted", "pid": os.getpid(), "reason": end.value},
        )
        await self._set_role(Role.STANDBY)

    async def _timer(self, fence: int | None) -> None:
        """Fire every leader-only job of this leadership from one timer: sleep until
        the soonest moment any job needs, then claim every slot and run-now request due
        by then in one claim and start their bodies. A row the tick's reload changed
        (a pause, a resume, a run now) is planned again at once. Never returns; a
        failed wake is logged and its jobs retried a tick later."""
        self._timetable = timetable = Timetable()
        self._claiming.clear()
        self._busy.clear()
        self._changed_while_claiming.clear()
        specs = {spec.id: spec for spec in self.leader_jobs}
        timetable.plan_all({job_id: self._next_step(job_id) for job_id in specs})
        while True:
            due = timetable.pop_due(self.clock.now())
            if due:
                try:
                    await self._wake([specs[job_id] for job_id in due], fence)
                except Exception:
                    logger.warning("scheduler: a timer wake failed", exc_info=True)
                    retry = self.clock.now() + timedelta(seconds=self.config.leader_tick_seconds)
                    for job_id in due:
                        if timetable.planned(job_id) is None:
                            timetable.plan(job_id, retry)
                continue
            soonest = timetable.soonest()
            # With nothing planned (every job paused) it still parks on the clock, a
            # tick at a time, as every waiting part of a leader does.
            delay = (
                self.config.leader_tick_seconds
                if soonest is None
                else (soonest - self.clock.now()).total_seconds()
            )
            await _first(self.clock.sleep(delay), timetable.changed.wait())
            timetable.changed.clear()

    def _plan_row(self, job_id: str) -> None:
        """Plan the job's next step from its row (see _next_step)."""
        self._timetable.plan(job_id, self._next_step(job_id))

    def _next_step(self, job_id: str) -> datetime | None:
        """When to act on the job, from its row: at once to register it if it has none,
        never while paused or while a newer registration made it per-worker (a reload
        plans it again), at once for its run-now request, else the claim lead before its
        next slot plus the slot's jitter."""
        row = self._rows.get(job_id)
        if row is not None and not row.leader_only:
            return None
        if row is None or row.run_requested_at is not None:
            return None if row is not None and row.paused else self.clock.now()
        if row.paused:
            return None
        fire_at = _fire_time(self.registry.jobs[job_id], row.next_run_at)
        return None if fire_at is None else fire_at - self._claim_ahead

    def _row_changed(self, job_id: str) -> None:
        """The tick's reload found the job's row changed: plan it again, or read it
        again once its claim under way is in."""
        if job_id in self._claiming:
            self._changed_while_claiming.add(job_id)
        else:
            self._plan_row(job_id)

    def _retry_in(self, job_id: str, seconds: float) -> None:
        self._timetable.plan(job_id, self.clock.now() + timedelta(seconds=seconds))

    async def _wake(self, specs: list[JobSpec], fence: int | None) -> None:
        """One wake of the timer: register the jobs that have no row, and claim every
        due slot or run-now request of the others in one claim; a slot that came due
        before the request is claimed first. Start the bodies of the claims that run,
        all before the next await, so that a demotion cannot fall between a claim and
        its start; a leadership already lost cancels them before they start (each is
        recorded cancelled). Plan each job's next step."""
        dues: list[Due] = []
        rows: dict[str, JobRow] = {}
        upcoming: list[tuple[datetime, JobSpec]] = []
        for spec in specs:
            if spec.id not in self._rows:
                await self._register_late(spec)
        now = self.clock.now()
        for spec in specs:
            row = self._rows.get(spec.id)
            if row is None or row.paused or not row.leader_only or spec.id in rows:
                continue
            rows[spec.id] = row
            fire_at = _fire_time(spec, row.next_run_at)
            request = row.run_requested_at
            slot_first = (
                fire_at is not None and fire_at <= now and (request is None or fire_at <= request)
            )
            if request is not None and not slot_first:
                dues.append(Due(spec, request, manual=True))
            elif fire_at is not None and fire_at <= now:
                dues.append(Due(spec, row.next_run_at))
            elif fire_at is None or fire_at > now + self._claim_ahead:
                # Not due after all: its row changed since it was planned.
                self._plan_row(spec.id)
            elif self.runner.is_running(spec.id) or _leased_at(row, fire_at):
                # A body of the job still runs, here or (its lease as last read says)
                # elsewhere, and may end before the slot: whether the slot runs or is
                # skipped is decided at the slot, not ahead of it.
                self._timetable.plan(spec.id, fire_at)
            else:
                upcoming.append((fire_at, spec))
        prepared = self._prepare(upcoming, dues, rows, now)
        if not dues:
            return
        claiming = {due.spec.id for due in dues}
        self._claiming |= claiming
        try:
            claims = await self._claim_to_its_answer(dues, fence, prepared)
        finally:
            self._claiming -= claiming
        starts_at = None if prepared is None else prepared.starts_at
        lost = self._lost.is_set()
        unmatched: dict[str, JobRow] = {}
        failed: list[tuple[str, Exception]] = []
        repaired: list[str] = []
        moved: list[str] = []
        # The bodies of a prepared claim begin together when the slot comes.
        gate = None if starts_at is None else asyncio.Event()
        gated: list[asyncio.Task[None]] = []
        with collector_held_off():
            for due, claim in zip(dues, claims, strict=True):
                spec, row = due.spec, rows[due.spec.id]
                if isinstance(claim, Exception):
                    failed.append((spec.id, claim))
                    continue
                if claim is None:
                    # Another process took it, the job was paused, or our key is gone.
                    self._busy.pop(spec.id, None)
                    unmatched[spec.id] = row
                    continue
                self._row_claimed(spec.id)
                requested = None if claim.manual else row.run_requested_at
                self._rows[spec.id] = replace(
                    row, next_run_at=claim.next_slot, run_requested_at=requested
                )
                if claim.runs:
                    body = self.runner.start(spec, claim, gate=gate)
                    gated.append(body)
                    self._bodies.add(body)
                    body.add_done_callback(self._bodies.discard)
                    if lost:
                        body.cancel()
                if spec.id in self._broken:
                    repaired.append(spec.id)
                moved.append(spec.id)
            if prepared is not None:
                self._committing.learn(len(gated))
            if starts_at is not None and gate is not None and gated:
                try:
                    # Checked again after each sleep: a wall clock slewed or stepped
                    # back ends a sleep before the moment it was computed for.
                    while (ahead := (starts_at - self.clock.now()).total_seconds()) > 0:
                        await self.clock.sleep(ahead)
                except asyncio.CancelledError:
                    # A step-down before the slot: they never begin (recorded cancelled).
                    for body in gated:
                        body.cancel()
                    raise
                gate.set()
            # The bodies take their first step before the bookkeeping below (and before
            # the collector runs again): the last of a thousand that share a slot is
            # not kept waiting for it.
            await asyncio.sleep(0)
        changed = [job_id for job_id in self._changed_while_claiming if job_id in claiming]
        self._changed_while_claiming -= claiming
        for job_id in moved:
            if job_id not in changed:
                self._plan_row(job_id)
        await self._read_again(unmatched, changed)
        for job_id, exc in failed:
            await self._job_failed(job_id, exc)
        if repaired:
            await self._broken.repaired(repaired)

    def _prepare(
        self,
        upcoming: list[tuple[datetime, JobSpec]],
        dues: list[Due],
        rows: dict[str, JobRow],
        now: datetime,
    ) -> PreparedCommit | None:
        """Of the slots that come due within the claim lead, add to ``dues`` those of the
        soonest instant, to be claimed now and committed then; the others are planned for
        the next wake. None, and nothing added, when ``dues`` holds slots due already:
        they are claimed at once, and the upcoming ones by the next wake."""
        if not upcoming:
            return None
        if dues:
            for _, spec in upcoming:
                self._timetable.plan(spec.id, now)
            return None
        starts_at = min(at for at, _ in upcoming)
        for at, spec in upcoming:
            if at == starts_at:
                dues.append(Due(spec, rows[spec.id].next_run_at))
            else:
                self._timetable.plan(spec.id, now)
        # Committed just early enough that its bodies are started, each waiting for the
        # slot, by the slot: then they all begin on time, back to back.
        commit_at = starts_at - self._committing.margin(len(dues), self._claim_ahead / 2)
        return PreparedCommit(
            starts_at,
            functools.partial(self._until_commit, commit_at),
            self.clock.now,
            (commit_at - now).total_seconds(),
        )

    async def _until_commit(self, commit_at: datetime) -> None:
        """The wait of a prepared claim: until its commit; a leadership lost meanwhile
        drops it (rolled back: the next leader runs its slots)."""
        while (ahead := (commit_at - self.clock.now()).total_seconds()) > 0:
            await self.clock.sleep(ahead)
        if self._lost.is_set():
            raise PreparedClaimDropped
        self._uncommitted = False
        self._committing.began()

    async def _claim_to_its_answer(
        self, dues: list[Due], fence: int | None, prepared: PreparedCommit | None
    ) -> list[Claim | Exception | None]:
        """_claim(), carried to its answer when the step-down cancels the timer meanwhile:
        a claim that committed just then has runs that no body will serve. They are
        started and cancelled at once, so each is recorded cancelled rather than left
        'running' until its lease runs out; then the cancel goes on. The answer is
        awaited for a leader tick at most: a statement that hangs (a partition) must not
        hold up the step-down, and its runs are then left to their lease. A prepared
        claim that has not begun to commit is rolled back at once instead: the next
        leader runs its slots."""
        self._uncommitted = prepared is not None
        claiming = asyncio.ensure_future(self._claim(dues, fence, prepared))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            if self._uncommitted:
                claiming.cancel()
                await asyncio.wait({claiming})
                raise
            try:
                await asyncio.wait({claiming}, timeout=self.config.leader_tick_seconds)
            finally:
                claiming.cancel()
            if claiming.done() and not claiming.cancelled() and claiming.exception() is None:
                for due, claim in zip(dues, claiming.result(), strict=True):
                    if isinstance(claim, Claim) and claim.runs:
                        self.runner.start(due.spec, claim).cancel()
            raise

    async def _claim(
        self, dues: list[Due], fence: int | None, prepared: PreparedCommit | None = None
    ) -> list[Claim | Exception | None]:
        """runner.claim_many(), and each job's failure in its place: when the claim of
        several fails while the database answers, each is claimed alone, so that the
        job whose row refuses the claim is told from the others. A prepared claim
        dropped for a lost leadership claimed nothing (None each)."""
        try:
            return await self.runner.claim_many(dues, fence, prepared)
        except PreparedClaimDropped:
            return [None] * len(dues)
        except Exception as exc:
            # While the database answers, one job's row (bad, or busy past a timeout)
            # must not hold up the others.
            if len(dues) == 1 or not await database_answers(self.store.engine, exc):
                return [exc] * len(dues)
            logger.warning(
                "scheduler.claim_one_by_one: the claim of %s jobs failed (%s); claiming each alone",
                len(dues),
                exc.__class__.__name__,
                extra={"action": "scheduler.claim_one_by_one", "pid": os.getpid()},
            )
        claims: list[Claim | Exception | None] = []
        for due in dues:
            try:
                claims += await self.runner.claim_many([due], fence, prepared)
            except PreparedClaimDropped:
                claims.append(None)
            except Exception as exc:
                claims.append(exc)
        return claims

    async def _read_again(self, unmatched: dict[str, JobRow], changed: list[str]) -> None:
        """Read again the rows of jobs whose claim matched nothing (each given with the
        row it was claimed from) and of jobs whose row the reload found changed while
        they were claimed, and plan them. A row unchanged since its claim is looked at
        again a tick later, or as soon as a reload finds it changed. When the read
        fails, each job keeps the row it has and the next tick reads its row again: the
        tick that found it changed has moved its horizon past the change already."""
        if not unmatched and not changed:
            return
        try:
            fresh = await self.store.load([*unmatched, *changed])
        except Exception:
            logger.warning(
                "scheduler: could not read the rows of jobs %s again; the next tick reads them",
                ", ".join(sorted({*unmatched, *changed})),
                exc_info=True,
            )
            self._unread.update(unmatched, changed)
            fresh = {}
        for job_id, before in unmatched.items():
            self._rows[job_id] = fresh.get(job_id, before)
            if self._rows[job_id] == before:
                self._retry_in(job_id, self.config.leader_tick_seconds)
            else:
                self._plan_row(job_id)
        for job_id in changed:
            if job_id not in unmatched:
                self._rows[job_id] = fresh.get(job_id, self._rows[job_id])
                self._plan_row(job_id)

    async def _register_late(self, spec: JobSpec) -> None:
        """Register the row of a job the promotion could not register."""
        try:
            self._rows[spec.id] = await self.store.register_leader_job(
                spec, self.clock.now(), self.config.zone
            )
        except Exception as exc:
            await self._job_failed(spec.id, exc)
            return
        await self._broken.repaired([spec.id])
        self._plan_row(spec.id)

    async def _job_failed(self, job_id: str, exc: Exception) -> None:
        """A job's step raised: a fault of the job (its trigger raised, its row refused
        the statement) marks it broken and retries it after the BROKEN_JOB backoff; a
        row held elsewhere is tried again soon (_row_busy); a passing outage retries it
        a tick later. Its other jobs are never held up."""
        if is_busy_row(exc):
            self._row_busy(job_id, exc)
            return
        if await blames_job(self.store.engine, exc):
            await self._broken.mark(job_id, format_error(exc))
            self._retry_in(job_id, BROKEN_JOB.delay(1))
            return
        logger.warning(
            "scheduler: claim of %s failed; retrying",
            job_id,
            exc_info=exc,
            extra={"action": "scheduler.claim_failed", "job_id": job_id},
        )
        self._retry_in(job_id, self.config.leader_tick_seconds)

    def _row_busy(self, job_id: str, exc: Exception) -> None:
        """The job's claim met its row held by another transaction: try again on the
        retry backoff, never more than a tick apart, so that a row held for a moment (an
        outcome or an operator's write) costs its slot a moment, and one held for long
        is claimed within a tick of its release. Logged once until it is claimed."""
        tries = self._busy.get(job_id, 0)
        self._busy[job_id] = tries + 1
        retry = min(self.config.leader_tick_seconds, BUSY_ROW.delay(tries + 1))
        if not tries:
            # A statement cut off on the row says why in the driver's words.
            reason = exc if isinstance(exc, JobRowBusyError) else getattr(exc, "orig", exc)
            logger.warning(
                "job.busy: job %s is due and its row is busy (%s); its other jobs fire, "
                "and it is tried again at least every %s s (pid=%s)",
                job_id,
                reason,
                self.config.leader_tick_seconds,
                os.getpid(),
                extra={"action": "job.busy", "job_id": job_id, "pid": os.getpid()},
            )
        self._retry_in(job_id, retry)

    def _row_claimed(self, job_id: str) -> None:
        """The job's claim got its row: a busy spell of it is over."""
        if self._busy.pop(job_id, None) is not None:
            logger.info(
                "job.row_free: job %s was claimed once its row was free (pid=%s)",
                job_id,
                os.getpid(),
                extra={"action": "job.row_free", "job_id": job_id, "pid": os.getpid()},
            )

    async def _service_after(
        self, spec: ServiceSpec, grace_ends: datetime, lock: LockConnection
    ) -> None:
        """Run a service once the whole handover grace has passed and no other copy of
        it holds the service's running lease. The grace ends early for jobs when the
        previous leader's backend is gone, since their claims are fenced; a service has
        no fence, and the old leader's copy of it runs until that leader notices its
        loss, which the grace gives it time to do. A copy that outlives its leadership
        (a thread of it still runs) holds its lease until it ended, or, its process
        dead, until the lease ran out. A crashed service is restarted only while this
        worker fires (see Runner.run_service)."""
        wait = (grace_ends - self.clock.now()).total_seconds()
        if wait > 0:
            await self.clock.sleep(wait)
        lease = await self._take_service_lease(spec, lock)
        await self.runner.run_service(spec, self._firing, lease)

    async def _take_service_lease(self, spec: ServiceSpec, lock: LockConnection) -> HeldLease:
        """Take the service's running lease for this leadership's copy, waiting while
        another copy holds it: tried again when a release's NOTIFY comes, else every
        tick or as the holder's lease runs out, whichever is first."""
        released = asyncio.Event()
        await lock.on_wake(released.set)
        waiting = False
        while True:
            released.clear()
            took = await self.runner.take_service_lease(spec, lock.backend_pid)
            if took.run_id is not None:
                return HeldLease(spec.id, took.run_id, "service")
            if took.pid is not None and not waiting:
                waiting = True
                logger.warning(
                    "service.waiting_for_previous_copy: service %s still runs elsewhere "
                    "(pid %s on %s, a thread of a stopped copy or a process that died); "
                    "starting it once that copy ends or its lease runs out, in at most %.1f s "
                    "(pid=%s)",
                    spec.id,
                    took.pid,
                    took.host,
                    took.left,
                    os.getpid(),
                    extra={
                        "action": "service.waiting_for_previous_copy",
                        "service_id": spec.id,
                        "pid": os.getpid(),
                    },
                )
            # No holder: released meanwhile (its NOTIFY is on its way) or this leader
            # lost the key (it steps down): a tick at most.
            tick = self.config.leader_tick_seconds
            wait = tick if took.pid is None else min(tick, max(took.left, 0.0))
            await _first(self.clock.sleep(wait), released.wait())

    async def _handover(self, lock: LockConnection | None, deadline: datetime) -> bool:
        """The handover grace: wait until the previous leader's backend is gone, for at
        most until ``deadline`` (HANDOVER_GRACE_SECONDS on the clock; less after
        stop()). False once the lock is lost. Services wait for the deadline whatever
        (_service_after).

        The grace lets an old leader that is about to notice its loss stop before we
        fire. A leader whose backend left the server (kill -9, terminated, its lease
        ran out) cannot fire any more: the claims' fence looks for its backend in
        pg_locks and ctx.fence refuses its term once ours begins. So the grace ends the
        moment the recorded backend is gone, asked every _GONE_POLL_SECONDS (a backend
        drops its locks a moment before it leaves pg_stat_activity); while it is still
        listed (a graceful handover) the grace runs to its end, ownership checked every
        leader tick (the checks keep the idle lock connection inside its lease).
        """
        checked = self.clock.now()
        tick = self.config.leader_tick_seconds
        while (left := (deadline - self.clock.now()).total_seconds()) > 0:
            if lock is not None:
                if await lock.previous_leader_gone(tick):
                    logger.info(
                        "scheduler.handover_skipped: the previous leader's backend is gone; "
                        "ending the handover grace (pid=%s)",
                        os.getpid(),
                        extra={"action": "scheduler.handover_skipped", "pid": os.getpid()},
                    )
                    break
                if (self.clock.now() - checked).total_seconds() >= tick:
                    checked = self.clock.now()
                    if not await lock.holds_lock(tick):
                        return False
            woken = await _first(
                self.clock.sleep(min(left, _GONE_POLL_SECONDS if lock is not None else tick)),
                self._lost.wait(),
                self._stopping.wait(),
            )
            if woken == 2:
                break
            if woken == 1:
                return False
        return lock is None or (not self._lost.is_set() and await lock.holds_lock(tick))

    async def _shutdown_grace(self, lock: LockConnection | None) -> None:
        """Let running bodies finish for up to the shutdown grace while this worker
        still owns the key, checking that every leader tick (which keeps the lock
        connection inside its lease); return early once it is lost."""
        # The whole grace in real time, as the process manager that stops us counts it.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.shutdown_grace_seconds):
                await self._tick_while_bodies_run(lock)

    async def _tick_while_bodies_run(self, lock: LockConnection | None) -> None:
        while self._bodies:
            woken = await _first(
                asyncio.wait(self._bodies),
                self.clock.sleep(self.config.leader_tick_seconds),
                self._lost.wait(),
            )
            if woken == 2:
                return
            if (
                woken == 1
                and lock is not None
                and not await lock.holds_lock(self.config.leader_tick_seconds)
            ):
                return

    async def _watch_leader_jobs(self) -> None:
        """While a standby, every leader tick: compare this worker's leader-only jobs
        and services with the ones the live leader of its schedule recorded. Those it
        lacks run nowhere (another app of the same name leads), so say so once per
        change (``scheduler.jobs_not_led``, then ``scheduler.jobs_led`` once they are
        led again) and keep their ids in ``unled_jobs`` for /health/scheduler. Never
        raises."""
        jobs = {spec.id for spec in self.leader_jobs}
        services = set(self.registry.services)
        if not jobs and not services:
            return
        while True:
            # Only a standby asks (and sleeps on the clock): a leader fires its own jobs.
            async with self._role_changed:
                await self._role_changed.wait_for(lambda: self.role is Role.STANDBY)
            unled, leader = self.unled_jobs, None
            try:
                leader = await self.store.leader_jobs()
            except Exception:
                logger.debug("scheduler: could not read the leader's jobs", exc_info=True)
            # No live recorded leader (a handover, a failed read): nothing new is known.
            if leader is not None:
                # A leader of a release that records no services: nothing is known.
                led_services = services if leader.service_ids is None else leader.service_ids
                unled = sorted((jobs - leader.job_ids) | (services - led_services))
            self._set_unled(unled, leader)
            await _first(self.clock.sleep(self.config.leader_tick_seconds), self._left_standby())
            if self.role is not Role.STANDBY:
                self._set_unled([], None)

    async def _follow_server_clock(self) -> None:
        """Every leader tick, in every role, measure the database server's clock again
        (when slots come due on it, a ServerClock): a host clock that drifts or steps
        moves when slots fire for at most a tick. Never raises; a failed reading keeps
        the last offset."""
        if not isinstance(self.clock, ServerClock):
            return
        while True:
            try:
                await self.clock.measure(self.store.server_now)
            except Exception:
                logger.debug("scheduler: could not read the database's clock", exc_info=True)
            await self.clock.sleep(self.config.leader_tick_seconds)

    async def _left_standby(self) -> None:
        async with self._role_changed:
            await self._role_changed.wait_for(lambda: self.role is not Role.STANDBY)

    def _set_unled(self, unled: list[str], leader: LeaderJobs | None) -> None:
        if unled != self.unled_jobs:
            self._report_unled(unled, leader)
            self.unled_jobs = unled

    def _report_unled(self, unled: list[str], leader: LeaderJobs | None) -> None:
        schedule, pid = self.store.schedule, os.getpid()
        if unled:
            assert leader is not None, "only a live leader's record shows unled jobs"
            logger.error(
                "scheduler.jobs_not_led: the leader of schedule %s (pid %s on %s) does not run "
                "jobs %s of this worker, so they run nowhere while it leads; deploy the "
                "same jobs and services in every app of schedule %s, or give this app its "
                "own schedule name (Scheduler(name=...) or SCHEDULER_NAME) (pid=%s)",
                schedule,
                leader.pid,
                leader.host,
                ", ".join(unled),
                schedule,
                pid,
                extra={"action": "scheduler.jobs_not_led", "job_ids": unled, "pid": pid},
            )
        else:
            logger.info(
                "scheduler.jobs_led: every job of this worker is fired by the leader of "
                "schedule %s again, or this worker no longer stands by (pid=%s)",
                schedule,
                pid,
                extra={"action": "scheduler.jobs_led", "pid": pid},
            )

    def _mark_lost(self) -> None:
        if not self._lost.is_set():
            logger.warning(
                "scheduler.lock_lost: the lock connection died (pid=%s)",
                os.getpid(),
                extra={"action": "scheduler.lock_lost", "pid": os.getpid()},
            )
        self._lost.set()

    async def _back_off(self, action: str, exc: BaseException) -> None:
        self._failures += 1
        delay = DATABASE.delay(self._failures)
        log_retry(action, exc, delay)
        await self._set_role(Role.STANDBY)
        await _first(self.clock.sleep(delay), self._stopping.wait())

    async def _set_role(self, role: Role) -> None:
        async with self._role_changed:
            changed = role is not self.role
            self.role = role
            self._role_changed.notify_all()
        if changed:
            self.runner.observers.role_changed(role.value)


def _fire_time(spec: JobSpec, slot: datetime) -> datetime | None:
    """When the job's slot fires: the slot plus its jitter. None when that is past the
    last moment a datetime holds (a next run an operator set to 'infinity'): such a
    slot never comes, and nothing else may stop for it."""
    try:
        return slot + timedelta(seconds=spec.jitter_delay(slot))
    except OverflowError:
        return None


def _leased_at(row: JobRow, moment: datetime) -> bool:
    """Whether the row, as last read, has a running lease that lasts to ``moment``."""
    return row.running_until is not None and row.running_until >= moment


def _loop_death(loop: asyncio.Task[None]) -> str:
    """Why the job timer, which should run for the whole leadership, ended."""
    if loop.cancelled():
        return "the job timer was cancelled while this worker leads"
    exc = loop.exception()
    return format_error(exc) if exc is not None else "the job timer returned"


async def _first(*awaitables: Awaitable[object]) -> int:
    """Await whichever finishes first, cancel the rest; return its index."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return next(index for index, task in enumerate(tasks) if task in done)
