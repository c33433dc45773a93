"""The public face of the engine: declare jobs and services, start, stop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .clock import Clock, ServerClock, SystemClock, lease_clock
from .config import Role, SchedulerConfig
from .errors import SchedulerError
from .events import Observers, RunFinished
from .keys import DEFAULT_SCHEDULE, validate_schedule_name
from .lock_target import DatabaseIdentity, engine_identity
from .loop import Stop, run_loop
from .registry import JobSpec, Registry, ServiceSpec
from .retry import SUPERVISOR_RESTART
from .runner import Runner
from .store import JobStore
from .supervisor import Supervisor
from .triggers import Trigger

__all__ = ["DuplicateScheduleError", "Scheduler"]

logger = logging.getLogger("app.scheduler")

F = TypeVar("F", bound=Callable[..., Any])


# The schedulers started in this process, by (database server identity, schedule
# name): two DSNs may spell one server differently (localhost, 127.0.0.1, a DNS alias).
_STARTED: dict[tuple[DatabaseIdentity, str], Scheduler] = {}


class DuplicateScheduleError(SchedulerError):
    """A second Scheduler of one schedule name was started in this process on the same
    database: both would queue for one leader key, and the jobs of whichever stands by
    would run only when the other stops. ``name`` is the schedule's name."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(
            f"a scheduler of schedule {name!r} is already started in this process "
            f"(pid {os.getpid()}) on this database; two of one name would queue for one "
            "leader key and one's jobs would not run; register every job on one Scheduler, "
            "or give each its own name: Scheduler(name=...)"
        )


class Scheduler:
    """A set of jobs and services, and (once started) the supervisor that fires them.

    Declare at import time with ``@scheduler.job(...)`` and ``@scheduler.service(...)``;
    the app's lifespan calls ``start()`` and ``stop()``.

    ``name`` names its schedule (see app/scheduler/keys.py): its leader key and its job
    rows are its name's, so apps of different names share one database, each with its
    own leader. None: the SCHEDULER_NAME setting the app starts it with (``default``).
    Raises InvalidScheduleNameError for a name that is empty, longer than 63
    characters or not letters, digits, ``_``, ``.``, ``:`` and ``-``.
    """

    def __init__(self, name: str | None = None) -> None:
        self._name = validate_schedule_name(name) if name is not None else None
        self._configured_name: str | None = None
        self.registry = Registry()
        self.observers = Observers()
        self.supervisor: Supervisor | None = None
        self._task: asyncio.Task[None] | None = None
        self._started_as: tuple[DatabaseIdentity, str] | None = None

    def job(
        self,
        trigger: Trigger,
        *,
        id: str,
        name: str | None = None,
        leader_only: bool = True,
        first_run: float | timedelta | None = None,
        timeout: float | timedelta | None = None,
        jitter: float | timedelta | None = None,
        misfire_grace: float | timedelta | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function as a job; return it unchanged.

        ``name`` is the human log string monitors match on (default: the id). An
        ``async def`` runs on the loop; a plain ``def`` runs in a worker thread.
        ``first_run`` is the delay from the first boot of the deployment (when the job's
        row is created) to its first slot, once per job row: a later restart or promotion
        never brings the job forward again. A ``leader_only=False`` job keeps its slots
        per worker, so there it is the delay after that worker boots. ``jitter`` delays
        each slot's fire by a fixed amount in [0, jitter) drawn from (id, slot).
        Raises InvalidJobError at once, naming the id, for a bad trigger, a duplicate
        id, a negative option or a non-callable.
        """

        def register(func: F) -> F:
            self.registry.add_job(
                func,
                trigger,
                id=id,
                name=name,
                leader_only=leader_only,
                first_run=first_run,
                timeout=timeout,
                jitter=jitter,
                misfire_grace=misfire_grace,
            )
            return func

        return register

    def service(self, *, id: str, name: str | None = None) -> Callable[[F], F]:
        """Register an ``async def`` that runs only while this worker leads.

        It is started on promotion, restarted with backoff when it crashes, and
        cancelled on demotion. A thread it started through the loop's default executor
        (``asyncio.to_thread``) that still runs then holds the service's running lease:
        no leader starts another copy until it ended. Raises InvalidJobError for a
        duplicate id or a sync function.
        """

        def register(func: F) -> F:
            self.registry.add_service(func, id=id, name=name)
            return func

        return register

    def observe(
        self,
        *,
        on_run: Callable[[RunFinished], None] | None = None,
        on_role: Callable[[str], None] | None = None,
    ) -> None:
        """Call ``on_run`` after every slot's outcome and ``on_role`` on each role change
        of this worker (``"leader"``, ``"standby"``, ...). Observers must not block."""
        if on_run is not None:
            self.observers.on_run.append(on_run)
        if on_role is not None:
            self.observers.on_role.append(on_role)

    @property
    def name(self) -> str:
        """The schedule's name: the one given, else the one ``start()`` was configured
        with, else ``default``."""
        return self._name or self._configured_name or DEFAULT_SCHEDULE

    @property
    def name_is_set(self) -> bool:
        """True once the name is known: given to the constructor, or configured by
        ``start()``. False while an unnamed scheduler would still take SCHEDULER_NAME
        at its start (``name`` then says ``default``): a tool that reads a schedule
        without starting it (the CLI, the test kit) reads SCHEDULER_NAME itself."""
        return (self._name or self._configured_name) is not None

    @property
    def jobs(self) -> dict[str, JobSpec]:
        """Registered jobs by id."""
        return dict(self.registry.jobs)

    @property
    def services(self) -> dict[str, ServiceSpec]:
        """Registered services by id."""
        return dict(self.registry.services)

    @property
    def role(self) -> Role:
        """This worker's role: STOPPED until started."""
        return self.supervisor.role if self.supervisor else Role.STOPPED

    async def start(
        self,
        config: SchedulerConfig,
        *,
        engine: AsyncEngine,
        sessions: async_sessionmaker[AsyncSession],
        sync_sessions: sessionmaker[Session],
        clock: Clock | None = None,
    ) -> Supervisor:
        """Start the supervisor task and return at once; the API never waits on it.

        Raises SchedulerError when already started, DuplicateScheduleError when
        another Scheduler of the same name runs in this process on the same database of
        the same server, however its DSN names it (unless ``config.simulated_workers``),
        and ConnectionError when ``engine``'s database does not answer (which server it
        is must be asked).

        On the system clock (the default) every "is it due" is read on the database
        server's clock instead, through a ServerClock the supervisor measures again every
        leader tick; the scheduler's jobs are given that clock too.
        """
        if self._task is not None and not self._task.done():
            raise SchedulerError("scheduler already started; call stop() first")
        self._configured_name = config.schedule
        started = (await engine_identity(engine), self.name)
        # Compared with same_as, not by equality: a role that may not read the server's
        # system identifier sees None there, and is still the same server.
        other = next(
            (
                scheduler
                for (identity, name), scheduler in _STARTED.items()
                if name == self.name and identity.same_as(started[0])
            ),
            None,
        )
        if other is not None and other is not self and not config.simulated_workers:
            raise DuplicateScheduleError(self.name)
        _STARTED.setdefault(started, self)
        self._started_as = started
        clock = clock or SystemClock()
        store = JobStore(
            engine,
            pid=os.getpid(),
            host=socket.gethostname(),
            lease_clock=lease_clock(clock),
            schedule=self.name,
        )
        if lease_clock(clock) is None:
            # Slots come due on the database server's clock, as leases run out on it:
            # the host's clock only measures the time since the last reading of it.
            if not isinstance(clock, ServerClock):
                clock = ServerClock(clock)
            try:
                await clock.measure(store.server_now)
            except DBAPIError as exc:
                raise ConnectionError(f"the app database did not answer: {exc}") from exc
        runner = Runner(
            store,
            clock=clock,
            zone=config.zone,
            sessions=sessions,
            sync_sessions=sync_sessions,
            observers=self.observers,
            lease_seconds=config.lease_seconds,
        )
        self.supervisor = Supervisor(self.registry, runner, store, config, clock)
        self._task = asyncio.create_task(self._supervise(self.supervisor), name="scheduler")
        return self.supervisor

    def begin_stop(self) -> None:
        """Begin stopping now and return at once (from a signal handler's call_soon):
        from here on this worker never promotes; ``stop()`` still waits for the end."""
        if self.supervisor is not None:
            self.supervisor.begin_stop()

    async def stop(self) -> None:
        """Stop firing, give running jobs the shutdown grace, release the key, return.

        A thread body may still run then (a thread cannot be stopped); it keeps its
        job's running lease until it ends. ``wait_for_threads()`` waits for it.
        """
        if self.supervisor is None or self._task is None:
            return
        if self._started_as is not None and _STARTED.get(self._started_as) is self:
            del _STARTED[self._started_as]
        self._started_as = None
        await self.supervisor.stop()
        grace = self.supervisor.config.shutdown_grace_seconds + 10
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace)
        except TimeoutError:
            logger.error("scheduler did not stop within %s s; cancelling it", grace)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._task = None

    async def wait_for_threads(self) -> None:
        """After ``stop()``: return once no job body of this process runs in a thread,
        no thread of a stopped service copy runs, every run's outcome is written and
        every copy's lease released (Runner.wait_for_bodies): the app disposes its
        engine next.

        A thread cannot be stopped, so ``stop()`` returns while one may still run; it
        keeps its running lease renewed and its real outcome is recorded (a service
        copy's lease released) when it ends, for as long as this event loop runs. The
        app's lifespan waits here so that the server does not end the process (and the
        thread) first.
        """
        if self._task is not None:
            raise SchedulerError("wait_for_threads() waits after stop(); call stop() first")
        if self.supervisor is None:
            return
        runner = self.supervisor.runner
        if running := [
            *sorted(runner.running_job_ids),
            *(f"service {service_id}" for service_id in sorted(runner.outliving_service_ids)),
        ]:
            logger.warning(
                "scheduler.waiting_for_threads: job bodies or service threads still run "
                "(%s); waiting for them to end (pid=%s)",
                ", ".join(running),
                os.getpid(),
                extra={"action": "scheduler.waiting_for_threads", "pid": os.getpid()},
            )
        await runner.wait_for_bodies()

    async def _supervise(self, supervisor: Supervisor) -> None:
        # A scheduler failure is logged, never reaches the API, and is retried.
        crashes = 0

        async def supervise() -> float | Stop[None]:
            nonlocal crashes
            try:
                await supervisor.run()
            except Exception:
                crashes += 1
                delay = SUPERVISOR_RESTART.delay(crashes)
                logger.exception(
                    "scheduler.crashed: restarting the supervisor in %s s (pid=%s)",
                    delay,
                    os.getpid(),
                    extra={"action": "scheduler.crashed", "pid": os.getpid()},
                )
                return delay
            return Stop(None)

        await run_loop(supervise, supervisor.clock)
