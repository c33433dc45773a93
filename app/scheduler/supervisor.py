"""The per-worker task: standby <-> leader. The role state machine is here; one
leadership, from promotion to step-down, is leadership.py, and its parts each have
their own module: tenure.py (the key: queueing for it, the handover, the term, the
shutdown grace), registration.py, rows.py (the leader's copy of its rows and its
timetable), tick.py, wake.py (the job timer and its claims), setbacks.py (a job step
that failed), services.py; standby.py watches the live leader's jobs.

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
import logging
import os

from .ahead import CommitCost
from .broken import BrokenJobs
from .clock import Clock, ServerClock
from .config import Role, SchedulerConfig
from .election import LockConnection
from .errors import ScheduleNameCollisionError
from .faults import UNREACHABLE
from .host_lock import HostLock
from .leadership import Leadership
from .lock_target import UnsafeLockConnectionError
from .loop import Stop, run_loop
from .registry import JobSpec, Registry
from .replicas import run_replica_jobs
from .retry import DATABASE, log_retry
from .roles import RoleState
from .runner import Runner
from .standby import LeaderJobsWatch
from .store import JobStore
from .tenure import LeadershipEnd, LockCheckError, acquire_key

__all__ = ["LeadershipEnd", "Supervisor"]

logger = logging.getLogger("app.scheduler")

# A lock-check error is a set-up problem that rarely clears by itself: outside
# production, fire unguarded this long between checks.
_FAIL_OPEN_SECONDS = 60.0


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
        self.clock = clock
        # What committing a prepared claim costs, learned across leaderships.
        self._committing = CommitCost()
        self._roles = RoleState()
        # The lock connection of the leadership under way; None between leaderships.
        self.lock: LockConnection | None = None
        # The leadership under way; None between leaderships.
        self.leading: Leadership | None = None
        self._stopping = asyncio.Event()
        self._acquiring: asyncio.Task[LockConnection] | None = None
        self._failures = 0
        self._firing = asyncio.Event()
        self._broken = BrokenJobs(store, clock)
        self._watch = LeaderJobsWatch(
            registry,
            store=store,
            roles=self._roles,
            clock=clock,
            tick_seconds=config.leader_tick_seconds,
        )
        self.refusal: str | None = None
        self._host_lock = (
            HostLock.for_key(config.host_lock_dir, config.lock_dsn, store.key.host_lock_id)
            if config.host_lock_dir is not None
            else None
        )

    @property
    def role(self) -> Role:
        """This worker's role now."""
        return self._roles.role

    @property
    def unled_jobs(self) -> list[str]:
        """Ids of the leader-only jobs and the services of this worker that the live
        leader of its schedule does not run (another app of the same name leads): they
        run nowhere. Kept while a standby (standby.LeaderJobsWatch)."""
        return self._watch.unled_jobs

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
        watch = asyncio.create_task(self._watch.run(), name="leader-jobs-watch")
        follow = asyncio.create_task(self._follow_server_clock(), name="server-clock")

        async def step() -> float | Stop[None]:
            if self._stopping.is_set():
                return Stop(None)
            return await self.run_once()

        try:
            await run_loop(step, self.clock, wakes=[self._stopping.wait])
        finally:
            for task in (replicas, watch, follow):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self._host_lock is not None:
                self._host_lock.release()
            await self._set_role(Role.STOPPED)

    async def run_once(self) -> float:
        """One pass: become leader (or fail open, or back off), lead until that ends.
        Returns the seconds to wait before the next pass (a backoff after a failure)."""
        try:
            self._acquiring = asyncio.ensure_future(
                acquire_key(self.store, self.config, self.clock, self._host_lock, self._standby)
            )
            lock = await self._acquiring
        except asyncio.CancelledError:
            if self._stopping.is_set():
                return 0.0
            raise
        except UNREACHABLE as exc:
            return await self._back_off("scheduler.lock_unreachable", exc)
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
            return 0.0
        except LockCheckError as exc:
            if self._stopping.is_set():
                return 0.0
            if self.config.fail_closed:
                return await self._back_off("scheduler.fail_closed", exc)
            logger.warning(
                "scheduler.fail_open: the lock check failed (%s); firing unguarded for %s s "
                "before checking again; slot claims still fire each slot once",
                exc,
                _FAIL_OPEN_SECONDS,
                extra={"action": "scheduler.fail_open", "pid": os.getpid()},
            )
            await self._lead(None, until=self.clock.monotonic() + _FAIL_OPEN_SECONDS)
            return 0.0
        finally:
            self._acquiring = None
        if self._stopping.is_set():
            # The key came as this worker began to stop (the old leader stopping at the
            # same moment): leading now would promote and demote at once, so the key
            # goes straight back to whoever waits next.
            await lock.release()
            return 0.0
        failure = await self._lead(lock)
        if failure is None:
            self._failures = 0
        elif not self._stopping.is_set():
            # A leadership that could not start (a read-only database, a missing
            # migration) would otherwise be retried as fast as the server answers.
            return await self._back_off("scheduler.leading_failed", failure)
        return 0.0

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
        async with asyncio.timeout(timeout):
            return await self._roles.until(lambda role: role in roles)

    async def _lead(
        self, lock: LockConnection | None, *, until: float | None = None
    ) -> BaseException | None:
        """Lead until the lock is lost, stop() or ``until`` (on Clock.monotonic). Returns
        the error that ended a leadership before it fired (its caller backs off), else
        None."""
        self.leading = leadership = Leadership(
            lock,
            leader_jobs=self.leader_jobs,
            registry=self.registry,
            runner=self.runner,
            store=self.store,
            broken=self._broken,
            committing=self._committing,
            clock=self.clock,
            config=self.config,
            stopping=self._stopping,
            firing=self._firing,
        )
        self.lock = lock
        await self._set_role(Role.LEADER if lock is not None else Role.UNGUARDED)
        logger.info(
            "scheduler.promoted (pid=%s, lock_backend_pid=%s)",
            os.getpid(),
            lock.backend_pid if lock else None,
            extra={"action": "scheduler.promoted", "pid": os.getpid()},
        )
        end = LeadershipEnd.STOPPED
        fired, failure = False, None
        try:
            ended = await leadership.begin()
            if ended is not None:
                end = ended
                return None
            self._firing.set()
            fired = True
            end = await leadership.lead(until)
        except Exception as exc:
            # The database went away while registering (a job's own fault only marks
            # that job broken): without the job rows we cannot lead.
            logger.warning("scheduler: leading failed", exc_info=True)
            end = LeadershipEnd.FAILED
            failure = None if fired else exc
        finally:
            await self._step_down(leadership, end)
        return failure

    async def _step_down(self, leadership: Leadership, end: LeadershipEnd) -> None:
        self._firing.clear()
        await leadership.step_down(end)
        self.lock = None
        self.leading = None
        logger.info(
            "scheduler.demoted (pid=%s, reason=%s)",
            os.getpid(),
            end.value,
            extra={"action": "scheduler.demoted", "pid": os.getpid(), "reason": end.value},
        )
        await self._set_role(Role.STANDBY)

    async def _follow_server_clock(self) -> None:
        """Every leader tick, in every role, measure the database server's clock again
        (when slots come due on it, a ServerClock): a host clock that drifts or steps
        moves when slots fire for at most a tick. The first measurement is a tick after
        the start when the start measured it (Scheduler.start): a reading beside the
        election would only hold up the first fire; at once when the start's reading
        was refused (the host's clock stepped during it, or the database was slow).
        Never raises; a failed reading keeps the last offset."""
        clock = self.clock
        if not isinstance(clock, ServerClock):
            return

        async def measure() -> float:
            try:
                await clock.measure(self.store.server_now)
            except Exception:
                logger.debug("scheduler: could not read the database's clock", exc_info=True)
            return self.config.leader_tick_seconds

        tick = self.config.leader_tick_seconds
        await run_loop(measure, clock, first_delay=tick if clock.measured else 0.0)

    async def _standby(self) -> None:
        await self._set_role(Role.STANDBY)

    async def _back_off(self, action: str, exc: BaseException) -> float:
        """Log the failure, stand by, and return the next pass's delay."""
        self._failures += 1
        delay = DATABASE.delay(self._failures)
        log_retry(action, exc, delay)
        await self._set_role(Role.STANDBY)
        return delay

    async def _set_role(self, role: Role) -> None:
        if await self._roles.set(role):
            self.runner.observers.role_changed(role.value)
