"""A leader's copy of a service: its running lease (taken before it starts, released
once it and every thread it started ended), its restarts after a crash, and its
threads that outlive it."""

from __future__ import annotations

import asyncio
import functools
import logging

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from .batching import LeaseKeeper
from .carried import Carried
from .clock import Clock
from .context import ServiceContext, service_log
from .loop import run_loop
from .outlast import Outlast, Outliving
from .recording import Recorder
from .registry import ServiceSpec
from .retry import SERVICE_RESTART
from .store import HeldLease, JobStore, ServiceTake
from .threads import RunThreads

__all__ = ["ServiceCopies"]

logger = logging.getLogger("app.scheduler")


class ServiceCopies:
    """Runs this process's service copies. It owns the copies stopped while threads
    they started run on (``outliving_ids``; ``pending``: their watches)."""

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Clock,
        sessions: async_sessionmaker[AsyncSession],
        lease_seconds: float,
        leases: LeaseKeeper,
        recorder: Recorder,
        outlast: Outlast,
        carried: Carried,
    ) -> None:
        self._store = store
        self._pid = store.pid
        self._clock = clock
        self._sessions = sessions
        self._lease_seconds = lease_seconds
        self._leases = leases
        self._recorder = recorder
        self._outlast = outlast
        self._carried = carried
        # The copies stopped while threads they started run on (and so hold their
        # leases): each one's watch, and the service's id.
        self._outliving: dict[asyncio.Future[None], str] = {}

    @property
    def outliving_ids(self) -> set[str]:
        """Ids of the services whose stopped copy left threads running in this process."""
        return set(self._outliving.values())

    @property
    def pending(self) -> list[asyncio.Future[None]]:
        """The watches of stopped copies whose threads still run."""
        return [watch for watch in self._outliving if not watch.done()]

    async def take_lease(self, spec: ServiceSpec, fence_pid: int) -> ServiceTake:
        """Take ``spec``'s running lease for a copy about to start
        (JobStore.take_service_lease), fenced by the lock connection of backend
        ``fence_pid``. A take cut off by a cancel is carried to its end; one that lands
        then is released at once, also carried (the runner waits for both)."""
        take = self._carried.spawn(
            self._store.take_service_lease(spec.id, self._lease_seconds, fence_pid)
        )
        try:
            return await asyncio.shield(take)
        except asyncio.CancelledError:
            self._carried.spawn(self._release_when_taken(spec.id, take))
            raise

    async def _release_when_taken(self, service_id: str, take: asyncio.Task[ServiceTake]) -> None:
        try:
            took = await take
        except Exception:
            return  # nothing was taken; the take's error was the cancelled copy's to see
        if took.run_id is not None:
            await self._recorder.release_service(HeldLease(service_id, took.run_id, "service"))

    async def run(self, spec: ServiceSpec, leading: asyncio.Event, lease: HeldLease) -> None:
        """Run a leader-only service until cancelled, restarting it with backoff when it
        crashes or returns while ``leading`` is set. Once ``leading`` is cleared (the
        worker steps down, then cancels the service) it is never restarted, even when
        the cancel reaches this loop as an error or a return (the service, or a
        TaskGroup in it, swallowed it): this raises CancelledError then.

        ``lease`` is the copy's running lease, taken by the leader for it
        (take_lease). It is renewed while the service's task or any thread it
        started (RunThreads) runs, here or after this returns, and released once all
        ended; a restart waits for the threads of the copy before it."""
        self._leases.hold(lease)
        threads = RunThreads()
        try:
            with threads.owning():
                await self._serve(spec, leading, threads)
        finally:
            threads.close()
            outliving = Outliving(
                "service",
                spec.id,
                spec.name,
                lease,
                functools.partial(self._recorder.release_service, lease),
                functools.partial(self._recorder.release_service_in_thread, lease),
            )
            if threads.has_ended:
                self._leases.drop(lease.run_id)
                # Released before the step-down lets the key go, so that the next
                # leader's copy starts at once; shielded, so that it lands whatever.
                await asyncio.shield(self._recorder.spawn(self._recorder.release_service(lease)))
            else:
                logger.warning(
                    'Service "%s" stopped while threads it started run on; its running lease '
                    "is renewed until they end, and no leader starts it before",
                    spec.name,
                    extra={
                        "action": "service.outlived_by_threads",
                        "service_id": spec.id,
                        "pid": self._pid,
                    },
                )
                task = asyncio.ensure_future(self._outlast.outlast(outliving, threads))
                self._outliving[task] = spec.id
                task.add_done_callback(self._outliving.pop)

    async def _serve(self, spec: ServiceSpec, leading: asyncio.Event, threads: RunThreads) -> None:
        log = service_log(spec.id, self._pid)
        failures = 0

        # One copy's life: the delay before the next (a restart), or the stop it raised.
        async def copy() -> float:
            nonlocal failures
            if threads.running:
                # A copy that crashed may leave a thread running: the next one waits.
                logger.warning(
                    'Service "%s" waits for the threads of its crashed copy before it restarts',
                    spec.name,
                    extra={
                        "action": "service.waiting_for_its_threads",
                        "service_id": spec.id,
                        "pid": self._pid,
                    },
                )
                await threads.wait()
            ctx = ServiceContext(spec.id, spec.name, self._clock, log, self._sessions)
            log.info(
                'Starting service "%s" (id=%s, pid=%s)',
                spec.name,
                spec.id,
                self._pid,
                extra={"action": "service.started"},
            )
            failure: BaseException | None = None
            try:
                await spec.func(ctx)
            except asyncio.CancelledError as exc:
                # A cancel of this task (a step-down, the loop's end) stops the service;
                # a cancel of one of its own inner tasks that escaped it is a crash.
                task = asyncio.current_task()
                if not leading.is_set() or (task is not None and task.cancelling()):
                    log.info('Service "%s" stopped', spec.name, extra={"action": "service.stopped"})
                    raise
                failure = exc
            except Exception as exc:
                failure = exc
            if not leading.is_set():
                # The service turned the cancel that stops it into an error of its own
                # (on Python 3.11 a TaskGroup raises a child's error in its place when
                # the child fails as the group is cancelled: an outbox drain whose
                # connection died with the server) or returned from it. It stops all
                # the same: restarted, it would run beside the next leader's copy, and
                # the demotion that cancelled it would wait for it for good. The flag,
                # not Task.cancelling(): 3.11's TaskGroup can leave that count raised
                # after a child's failure that no cancel caused.
                log.info('Service "%s" stopped', spec.name, extra={"action": "service.stopped"})
                raise asyncio.CancelledError from failure
            if failure is None:
                log.warning('Service "%s" returned; restarting it', spec.name)
            else:
                log.error(
                    'Service "%s" crashed; restarting it',
                    spec.name,
                    exc_info=failure,
                    extra={"action": "service.crashed"},
                )
            failures += 1
            return SERVICE_RESTART.delay(failures)

        await run_loop(copy, self._clock)
