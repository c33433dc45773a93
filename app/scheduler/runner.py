"""One fire of one job: claim the slot, run the body, record the outcome.

Async bodies run on the event loop; sync bodies run through ``asyncio.to_thread`` and
never on the loop. The runner opens the job's sessions lazily, commits them when the
body returns normally, and always closes them (rolling back whatever is uncommitted).
A body that raises is logged with its traceback and recorded as ``error``; it never
reaches the supervisor, so the next slot still fires.

The runner lives as long as the process's scheduler, so it is what remembers which
jobs have a body running here, across promotions. A leader run holds the job's running
lease, a per-worker run a lease on its own run row (see store.py); the runner renews
either every third of the lease while the body runs (a failed renewal is retried
within seconds) and clears it when the body ends.
Cancelling a run (demotion, shutdown) stops an async body at once; a thread cannot be
stopped, so it runs on, still holding the lease, and its real outcome is recorded when
it ends. ``wait_for_bodies()`` waits for those threads (the app's lifespan does, after
the scheduler stopped).

A thread body runs on an executor future, watched by a task that renews the lease and
records the outcome. The end of the event loop cancels that task (``asyncio.run``
cancels every task before it waits for the threads): the watcher then hands the run
over to the thread's side (threads.py), where a keeper thread renews the lease and the
body's thread records the outcome, so the lease never lapses while the process and
its body live.

The same watch (``_outlast``: the one rule for work that outlives its cancellation)
keeps the lease of an async body, and of a service copy, whose threads
(``asyncio.to_thread``, seen through threads.RunThreads) run on after its task ended:
renewed until they end, then released; handed over the same way if the loop ends
first. A service copy's lease is on its service's row, taken by the leader before the
copy starts (``take_service_lease``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .batching import LeaseKeeper, OutcomeWriter
from .clock import Clock
from .context import JobContext, ServiceContext
from .errors import JobRowBusyError, SchedulerError
from .events import Observers, RunFinished
from .registry import JobSpec, ServiceSpec
from .retry import OUTCOME_WRITE, SERVICE_RESTART
from .store import JobStore
from .store.claims import ClaimedSlot, SlotClaim
from .store.leases import HeldLease, ServiceTake
from .store.prepared import PreparedCommit
from .store.runs import Outcome, format_error
from .store.thread_store import ThreadStore
from .threads import RunThreads, keep_lease, owning_executor
from .triggers import COUNTED_SLOTS, Trigger

__all__ = ["Claim", "Due", "Runner"]

logger = logging.getLogger("app.scheduler")

_RECORD_TIMEOUT = 10.0
_CANCELLED = "cancelled: this worker stopped leading or shut down"
_CANCELLED_BEFORE_START = (
    "cancelled before its body started: this worker stopped leading or shut down"
)
_PAUSED_BEFORE_START = "cancelled before its body started: the job was paused before its slot"
_BUSY_HERE = "the previous run was still going in this process"
# Claim outcomes that start no body.
_NOT_RUN = ("already_recorded", "skipped_overlap")


@dataclass(frozen=True)
class Due:
    """What a leader claims for a job: its slot ``due`` (the job's next_run_at), or
    with ``manual`` its run-now request made at ``due``."""

    spec: JobSpec
    due: datetime
    manual: bool = False


@dataclass(frozen=True)
class _Planned:
    """A claim about to be made: the job and what its claim writes."""

    spec: JobSpec
    item: SlotClaim


@dataclass(frozen=True)
class Claim:
    """A slot this process won: its run row, the slot run, and the job's next slot.

    ``leased``: the run holds a running lease: the job row's for a leader run; its own
    run row's for a per-worker run (``replica``), which many workers run at once.
    ``jitter``: seconds the fire waited after the slot by design; lateness counts from
    the slot plus the jitter.
    ``term``: the leadership term the claim saw, which fences the body's commits; None
    for a replica run, which no leadership fences.
    ``manual``: the run-now request was claimed, not a slot; the slot run is the
    request time and the job's next slot is where the claim found it.
    ``leased_at``: the moment, on this process's clock, its running lease was taken as of.
    """

    run_id: int
    slot: datetime
    next_slot: datetime
    runs: bool
    leased: bool = False
    jitter: float = 0.0
    term: int | None = None
    manual: bool = False
    replica: bool = False
    leased_at: datetime | None = None


def _run_in_thread(func: Callable[[JobContext], Any], ctx: JobContext) -> None:
    try:
        result = func(ctx)
        if inspect.isawaitable(result):
            # A plain def that returns a coroutine never ran its body: not a success.
            if inspect.iscoroutine(result):
                result.close()
            raise SchedulerError(
                f'job "{ctx.job_id}" is a plain def that returned {type(result).__name__}, '
                "so its body never ran; declare it `async def`"
            )
        ctx.commit_sync()
    finally:
        ctx.close_sync()


def _body_in_thread(run: _Run, func: Callable[[JobContext], Any], ctx: JobContext) -> None:
    """A sync body in its worker thread; what it raised is kept on its run."""
    try:
        _run_in_thread(func, ctx)
    except BaseException as exc:
        run.raised = exc


class Runner:
    """Runs fires for one process and knows which jobs have a body running in it; the
    supervisor owns timing. ``lease_seconds`` is the length of a run's running lease."""

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Clock,
        zone: ZoneInfo,
        sessions: async_sessionmaker[AsyncSession],
        sync_sessions: sessionmaker[Session],
        observers: Observers | None = None,
        lease_seconds: float = 30,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be above zero, got {lease_seconds!r}")
        self.observers = observers or Observers()
        self.store = store
        self.clock = clock
        self.zone = zone
        self.sessions = sessions
        self.sync_sessions = sync_sessions
        self.lease_seconds = lease_seconds
        self.thread_store = ThreadStore(
            sync_sessions, store.schedule, lease_clock=store.lease_clock
        )
        # Per job, what is alive while its body runs: the run's task until the body
        # starts, then a future of the body (async) or the task watching its thread.
        self._alive: dict[str, asyncio.Future[Any]] = {}
        # Per job, the task of a body started ahead of its slot, until it begins; and
        # those cancelled because the job was paused meanwhile.
        self._waiting: dict[str, asyncio.Task[None]] = {}
        self._paused_before_start: dict[str, asyncio.Task[None]] = {}
        # Outcome writes under way, kept from the garbage collector until they land.
        self._writes: set[asyncio.Task[None]] = set()
        # The service copies stopped while threads they started run on (and so hold
        # their leases): each one's watch, and the service's id.
        self._outliving: dict[asyncio.Future[None], str] = {}
        self._outcomes = OutcomeWriter(store)
        self._leases = LeaseKeeper(store, clock=clock, lease_seconds=lease_seconds)

    @property
    def running_job_ids(self) -> set[str]:
        """Ids of the jobs whose body runs in this process now, whoever leads."""
        return {job_id for job_id, alive in self._alive.items() if not alive.done()}

    def is_running(self, job_id: str) -> bool:
        """True while a body of the job runs in this process (a thread may outlive the
        run's task and this worker's leadership)."""
        alive = self._alive.get(job_id)
        return alive is not None and not alive.done()

    @property
    def renewing(self) -> frozenset[int]:
        """The runs whose running lease this process renews now (its LeaseKeeper's):
        every reap it makes leaves them alone, since their bodies run here."""
        return self._leases.renewing

    @property
    def outliving_service_ids(self) -> set[str]:
        """Ids of the services whose stopped copy left threads running in this process."""
        return set(self._outliving.values())

    async def wait_for_bodies(self) -> None:
        """Return once no job body and no thread of a stopped service copy runs in this
        process, each run recorded with its outcome and each copy's lease released, the
        run cancelled before its body started too (its record is a write of its own):
        the app disposes the engine next, and a write holding a pool connection across
        that would leak it. A thread that outlived its run's task keeps its lease
        renewed meanwhile."""
        while pending := [
            *(alive for alive in self._alive.values() if not alive.done()),
            *(watch for watch in self._outliving if not watch.done()),
            *(write for write in self._writes if not write.done()),
        ]:
            await asyncio.wait(pending)

    def start(
        self, spec: JobSpec, claim: Claim, *, gate: asyncio.Event | None = None
    ) -> asyncio.Task[None]:
        """Run a claimed slot in a new task, once ``gate`` is set if given (a claim
        committed ahead of its slot: the gate opens at the slot); the job counts as
        running from this call on.

        Cancelling the task cancels an async body (one cancelled before it began is
        recorded cancelled); a thread runs on and is recorded when it ends.
        """
        began = asyncio.Event()
        task = asyncio.create_task(self._execute_from_start(spec, claim, began, gate), name=spec.id)
        self._alive[spec.id] = task
        if gate is not None:
            self._waiting[spec.id] = task
        task.add_done_callback(functools.partial(self._if_never_started, spec, claim, began))
        return task

    async def _execute_from_start(
        self, spec: JobSpec, claim: Claim, began: asyncio.Event, gate: asyncio.Event | None
    ) -> None:
        if gate is not None:
            await gate.wait()
            self._waiting.pop(spec.id, None)
        began.set()
        await self.execute(spec, claim)

    def _if_never_started(
        self, spec: JobSpec, claim: Claim, began: asyncio.Event, task: asyncio.Task[None]
    ) -> None:
        # A task cancelled before its first step never enters execute(): its claimed run
        # would stay 'running' and hold the job's lease until it ran out. Record it.
        if began.is_set() or not task.cancelled():
            return
        paused = self._paused_before_start.pop(spec.id, None) is task
        if self._waiting.get(spec.id) is task:
            del self._waiting[spec.id]
        log = _adapter(f"app.jobs.{spec.id}", spec.id, self.store.pid)
        run = _Run(spec, claim, log, time.perf_counter(), self.clock.now() - claim.slot)
        error = _PAUSED_BEFORE_START if paused else _CANCELLED_BEFORE_START
        self._spawn(self._finish(run, "cancelled", error))

    def drop_for_pause(self, job_id: str) -> None:
        """The job was paused: its body started ahead of its slot (start(gate=...)) that
        has not begun yet never begins; its run is recorded cancelled."""
        task = self._waiting.get(job_id)
        if task is not None and not task.done():
            self._paused_before_start[job_id] = task
            task.cancel()

    def _spawn(self, write: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run an outcome write to its end whatever happens to the task that asked for
        it (a demotion cancels that task; the write must still land)."""
        task = asyncio.ensure_future(write)
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return task

    async def claim_many(
        self, dues: Sequence[Due], fence_pid: int | None, prepared: PreparedCommit | None = None
    ) -> list[Claim | Exception | None]:
        """Claim every slot and run-now request in ``dues`` (one per job) in one commit
        of a few statements (JobStore.claim_many); each claim commits before any body
        runs. Returns, in order, each one's Claim, or None where the claim matched
        nothing (another process took it, the job is paused, or this process no longer
        holds the lock), or the exception its job's trigger raised or the
        JobRowBusyError of a row another transaction holds (that job was not claimed;
        the others were).

        A slot: late slots coalesce into one run of the latest slot; with
        ``misfire_grace`` a slot later than the grace is claimed as ``missed`` instead of
        run; while a body of the job runs in this process it is claimed as
        ``skipped_overlap``. Jobs that share a trigger and a due slot share its slot
        math, computed once.

        A run-now request: one more run, whose slot is the request time, that fires at
        once (no jitter, no misfire grace, nothing coalesced) and leaves the job's next
        slot alone; like a slot, it is recorded skipped_overlap while a body of the job
        runs here or holds the running lease elsewhere.

        ``prepared``: the claim is made now and committed at its ``starts_at``
        (JobStore.claim_many), planned as of that instant.
        """
        # Read right before the claim: the running lease starts at this instant.
        now = self.clock.now() if prepared is None else prepared.start()
        slots: dict[tuple[Trigger, datetime], tuple[datetime, int, datetime]] = {}
        plans: list[_Planned | Exception] = []
        for due in dues:
            try:
                plans.append(self._plan(due, now, slots))
            except Exception as exc:
                plans.append(exc)
        items = [plan.item for plan in plans if isinstance(plan, _Planned)]
        claimed = iter(
            await self.store.claim_many(
                items,
                now=now,
                fence_pid=fence_pid,
                prepared=prepared,
                renewing=self._leases.renewing,
            )
        )
        return [
            plan if isinstance(plan, Exception) else self._claimed(plan, next(claimed), now)
            for plan in plans
        ]

    def _plan(
        self,
        due: Due,
        now: datetime,
        slots: dict[tuple[Trigger, datetime], tuple[datetime, int, datetime]],
    ) -> _Planned:
        """What claiming ``due`` at ``now`` writes; raises what the job's trigger raises."""
        spec = due.spec
        busy_here = self.is_running(spec.id)
        if due.manual:
            item = SlotClaim.request(
                spec.id,
                due.due,
                status="skipped_overlap" if busy_here else "running",
                lease_seconds=None if busy_here else self.lease_seconds,
                error=_BUSY_HERE if busy_here else None,
            )
            return _Planned(spec, item)
        key = (spec.trigger, due.due)
        if key not in slots:
            latest, passed = spec.trigger.latest_slot(due.due, now, self.zone)
            slots[key] = (latest, passed, spec.trigger.next_after(latest, self.zone))
        latest, passed, next_slot = slots[key]
        if busy_here:
            item = SlotClaim(
                spec.id, due.due, latest, next_slot, "skipped_overlap", error=_BUSY_HERE
            )
            return _Planned(spec, item)
        grace = spec.misfire_grace
        jitter = spec.jitter_delay(latest)
        # Lateness counts from when the schedule meant to fire: the slot plus its jitter.
        missed = grace is not None and (now - latest).total_seconds() - jitter > grace
        error = missed_before = None
        # Past COUNTED_SLOTS the trigger stopped counting: the note says "at least".
        at_least = "at least " if passed >= COUNTED_SLOTS else ""
        if missed:
            error = f"{at_least}{passed + 1} slot(s) later than misfire_grace ({grace:g} s) skipped"
        elif grace is not None and passed:
            missed_before = (
                due.due,
                f"{at_least}{passed} slot(s) later than misfire_grace ({grace:g} s)",
            )
        item = SlotClaim(
            spec.id,
            due.due,
            latest,
            next_slot,
            "missed" if missed else "running",
            lease_seconds=None if missed else self.lease_seconds,
            error=error,
            missed_before=missed_before,
            jitter=jitter,
        )
        return _Planned(spec, item)

    def _claimed(
        self, plan: _Planned, claimed: ClaimedSlot | JobRowBusyError | None, now: datetime
    ) -> Claim | JobRowBusyError | None:
        """The Claim of a planned claim the store answered; logs and counts what starts
        no body."""
        if claimed is None or isinstance(claimed, JobRowBusyError):
            return claimed
        spec, item = plan.spec, plan.item
        next_slot = claimed.next_slot if item.next_slot is None else item.next_slot
        if claimed.status in _NOT_RUN:
            return self._not_run(spec, claimed, item.run_slot, next_slot, now, manual=item.manual)
        if item.status == "missed":
            logger.warning(
                'Missed job "%s" (id=%s, slot=%s, pid=%s)',
                spec.name,
                spec.id,
                item.run_slot.isoformat(),
                self.store.pid,
                extra={"action": "job.missed", "job_id": spec.id, "pid": self.store.pid},
            )
            self._observe(spec, "missed", 0.0, now - item.run_slot)
        runs = item.status == "running"
        return Claim(
            claimed.run_id,
            item.run_slot,
            next_slot,
            runs=runs,
            leased=runs,
            jitter=item.jitter,
            term=claimed.term,
            manual=item.manual,
            leased_at=now,
        )

    def _not_run(
        self,
        spec: JobSpec,
        claimed: ClaimedSlot,
        slot: datetime,
        next_slot: datetime,
        now: datetime,
        *,
        manual: bool = False,
    ) -> Claim:
        """Log and count a claim that starts no body: its slot already has a run, or
        another body of the job holds the running lease."""
        if claimed.status == "already_recorded":
            logger.warning(
                'Job "%s" came back to a slot it has run: %s; moving on (id=%s, pid=%s)',
                spec.name,
                claimed.error,
                spec.id,
                self.store.pid,
                extra={"action": "job.slot_already_run", "job_id": spec.id, "pid": self.store.pid},
            )
        else:
            logger.warning(
                'Skipped job "%s": %s (id=%s, slot=%s, pid=%s)',
                spec.name,
                claimed.error,
                spec.id,
                slot.isoformat(),
                self.store.pid,
                extra={"action": "job.skipped_overlap", "job_id": spec.id, "pid": self.store.pid},
            )
            self._observe(spec, "skipped_overlap", 0.0, now - slot)
        return Claim(claimed.run_id, slot, next_slot, runs=False, manual=manual)

    async def fire_replica(self, spec: JobSpec, slot: datetime, *, jitter: float = 0.0) -> int:
        """Run a per-replica job's slot on this worker: no claim, no lock; the run holds
        a running lease on its own run row, renewed as a leader run's. Runs of the job
        whose worker died are reaped as it starts. ``jitter``: the seconds this worker
        waited after the slot by design. Returns the run's id once its outcome is
        recorded (a thread past its timeout may still run)."""
        now = self.clock.now()
        run_id, reaped = await self.store.start_replica_run(
            spec,
            slot,
            now,
            lease_seconds=self.lease_seconds,
            jitter=jitter,
            renewing=self._leases.renewing,
        )
        for dead in reaped:
            logger.warning(
                "job.abandoned: run %s of job %s was abandoned: its worker (pid %s on %s) "
                "stopped renewing its running lease",
                dead.run_id,
                dead.job_id,
                dead.pid,
                dead.host,
                extra={"action": "job.abandoned", "job_id": dead.job_id, "pid": self.store.pid},
            )
        claim = Claim(
            run_id, slot, slot, runs=True, leased=True, jitter=jitter, replica=True, leased_at=now
        )
        await self.execute(spec, claim)
        return run_id

    async def take_service_lease(self, spec: ServiceSpec, fence_pid: int) -> ServiceTake:
        """Take ``spec``'s running lease for a copy about to start
        (JobStore.take_service_lease), fenced by the lock connection of backend
        ``fence_pid``. A take cut off by a cancel lands or not; one that lands then is
        released at once."""
        take = asyncio.ensure_future(
            self.store.take_service_lease(spec.id, self.lease_seconds, fence_pid)
        )
        try:
            return await asyncio.shield(take)
        except asyncio.CancelledError:
            take.add_done_callback(functools.partial(self._release_if_taken, spec.id))
            raise

    def _release_if_taken(self, service_id: str, take: asyncio.Future[ServiceTake]) -> None:
        if take.cancelled() or take.exception() is not None:
            return
        run_id = take.result().run_id
        if run_id is not None:
            self._spawn(self._release_service(HeldLease(service_id, run_id, "service")))

    async def run_service(
        self, spec: ServiceSpec, leading: asyncio.Event, lease: HeldLease
    ) -> None:
        """Run a leader-only service until cancelled, restarting it with backoff when it
        crashes or returns while ``leading`` is set. Once ``leading`` is cleared (the
        worker steps down, then cancels the service) it is never restarted, even when
        the cancel reaches this loop as an error or a return (the service, or a
        TaskGroup in it, swallowed it): this raises CancelledError then.

        ``lease`` is the copy's running lease, taken by the leader for it
        (take_service_lease). It is renewed while the service's task or any thread it
        started (RunThreads) runs, here or after this returns, and released once all
        ended; a restart waits for the threads of the copy before it."""
        self._leases.hold(lease)
        threads = RunThreads()
        try:
            with threads.owning():
                await self._serve(spec, leading, threads)
        finally:
            threads.close()
            outliving = _Outliving(
                "service",
                spec.id,
                spec.name,
                lease,
                functools.partial(self._release_service, lease),
                functools.partial(self._release_service_in_thread, lease),
            )
            if threads.ended.is_set():
                self._leases.drop(lease.run_id)
                # Released before the step-down lets the key go, so that the next
                # leader's copy starts at once; shielded, so that it lands whatever.
                await asyncio.shield(self._spawn(self._release_service(lease)))
            else:
                logger.warning(
                    'Service "%s" stopped while threads it started run on; its running lease '
                    "is renewed until they end, and no leader starts it before",
                    spec.name,
                    extra={
                        "action": "service.outlived_by_threads",
                        "service_id": spec.id,
                        "pid": self.store.pid,
                    },
                )
                task = asyncio.ensure_future(self._outlast(outliving, threads))
                self._outliving[task] = spec.id
                task.add_done_callback(self._outliving.pop)

    async def _serve(self, spec: ServiceSpec, leading: asyncio.Event, threads: RunThreads) -> None:
        log = _adapter(f"app.services.{spec.id}", spec.id, self.store.pid)
        failures = 0
        while True:
            if threads.running:
                # A copy that crashed may leave a thread running: the next one waits.
                logger.warning(
                    'Service "%s" waits for the threads of its crashed copy before it restarts',
                    spec.name,
                    extra={
                        "action": "service.waiting_for_its_threads",
                        "service_id": spec.id,
                        "pid": self.store.pid,
                    },
                )
                await threads.wait()
            ctx = ServiceContext(spec.id, spec.name, self.clock, log, self.sessions)
            log.info(
                'Starting service "%s" (id=%s, pid=%s)',
                spec.name,
                spec.id,
                self.store.pid,
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
            await self.clock.sleep(SERVICE_RESTART.delay(failures))

    async def execute(self, spec: JobSpec, claim: Claim) -> None:
        """Run the body of a claimed slot and record how it ended. Never raises but
        CancelledError: an async body is then recorded ``cancelled``; a thread runs on and
        its outcome is recorded (and logged) when it ends. The run's lease holds while
        its body or any thread it started (RunThreads) runs."""
        pid, slot = self.store.pid, claim.slot
        log = _adapter(f"app.jobs.{spec.id}", spec.id, pid)
        logger.info(
            'Running job "%s" (id=%s, slot=%s, pid=%s)',
            spec.name,
            spec.id,
            slot.isoformat(),
            pid,
            extra={"action": "job.running", "job_id": spec.id, "pid": pid},
        )
        ctx = JobContext(
            job_id=spec.id,
            name=spec.name,
            scheduled_at=slot,
            clock=self.clock,
            log=log,
            zone=self.zone,
            term=claim.term,
            schedule=self.store.schedule,
            _sessions=self.sessions if spec.is_async else None,
            _sync_sessions=None if spec.is_async else self.sync_sessions,
        )
        lateness = self.clock.now() - slot - timedelta(seconds=claim.jitter)
        run = _Run(spec, claim, log, time.perf_counter(), lateness)
        if spec.is_async:
            await self._run_async(run, ctx)
            return
        threads = RunThreads()
        body = functools.partial(_body_in_thread, run, spec.func, ctx)
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        # An executor future, not a task (as asyncio.to_thread would make): the loop's
        # end cancels tasks, and a body queued behind busy workers must still run, and
        # be recorded, once submitted.
        with threads.owning():
            owning_executor(loop).submit(context.run, body)
        threads.close()
        watcher = asyncio.ensure_future(self._watch_thread(run, threads))
        self._alive[spec.id] = watcher
        try:
            await asyncio.shield(watcher)
        except asyncio.CancelledError:
            if not watcher.done():
                run.detached = True
                logger.warning(
                    'Job "%s" runs on in its thread after its run was cancelled (this worker '
                    "stopped leading or shuts down); its running lease is renewed and its "
                    "outcome recorded when it ends",
                    spec.name,
                    extra={"action": "job.outlived_leadership", "job_id": spec.id, "pid": pid},
                )
            raise

    async def _run_async(self, run: _Run, ctx: JobContext) -> None:
        spec = run.spec
        alive: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._alive[spec.id] = alive
        self._hold_lease(run)
        threads = RunThreads()
        outlived = False
        try:
            status, error = "ok", None
            try:
                try:
                    with threads.owning():
                        async with asyncio.timeout(spec.timeout) as deadline:
                            await spec.func(ctx)
                            await ctx.commit()
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    status, error = "timeout", f"cancelled after timeout={spec.timeout:g} s"
                finally:
                    await ctx.aclose()
            except asyncio.CancelledError:
                outlived = self._outlived_by_threads(run, threads, "cancelled", _CANCELLED)
                await self._finish(run, "cancelled", _CANCELLED, body_ended=not outlived)
                raise
            except Exception as exc:
                status, error = "error", format_error(exc)
                run.log.exception('Job "%s" raised', spec.name, extra={"action": "job.error"})
            outlived = self._outlived_by_threads(run, threads, status, error)
            await self._finish(run, status, error, body_ended=not outlived)
            if status == "timeout":
                run.log.warning(
                    'Job "%s" timed out: %s', spec.name, error, extra={"action": "job.timeout"}
                )
        finally:
            if not outlived:
                self._leases.drop(run.claim.run_id)
            alive.set_result(None)

    def _outlived_by_threads(
        self, run: _Run, threads: RunThreads, status: str, error: str | None
    ) -> bool:
        """An async body ended (``status``): True when threads it started run on. Its
        outcome is then recorded without clearing its lease, and the job stays busy
        here, its lease renewed, until they end (then the lease is released)."""
        threads.close()
        if threads.ended.is_set():
            return False
        run.recorded = (status, error)
        watcher = asyncio.ensure_future(self._outlast(self._job_outliving(run), threads))
        self._alive[run.spec.id] = watcher
        logger.warning(
            'Job "%s" ended (%s) while threads it started run on; its running lease is '
            "renewed until they end, and the job's next slots are skipped until then",
            run.spec.name,
            status,
            extra={
                "action": "job.outlived_by_threads",
                "job_id": run.spec.id,
                "pid": self.store.pid,
            },
        )
        return True

    async def _watch_thread(self, run: _Run, threads: RunThreads) -> None:
        """Wait for a sync body's thread and record its outcome, however long it runs
        (its timeout recorded meanwhile); hand the run over to the thread's side if the
        event loop goes away first."""
        self._hold_lease(run)
        await self._outlast(
            self._job_outliving(run),
            threads,
            timeout=run.spec.timeout,
            on_timeout=functools.partial(self._record_timeout, run),
        )

    def _job_outliving(self, run: _Run) -> _Outliving:
        lease = (
            HeldLease(run.spec.id, run.claim.run_id, "run" if run.claim.replica else "job")
            if run.claim.leased
            else None
        )
        return _Outliving(
            "job",
            run.spec.id,
            run.spec.name,
            lease,
            functools.partial(self._settle, run),
            functools.partial(self._settle_in_thread, run),
        )

    async def _outlast(
        self,
        outliving: _Outliving,
        threads: RunThreads,
        *,
        timeout: float | None = None,
        on_timeout: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """The one rule for work that outlives its cancellation: keep the run's lease
        renewed until its own part and every thread of it ended (``threads``, closed),
        then settle it on the loop (record its outcome, or release its lease). With
        ``timeout``, ``on_timeout()`` runs once that many seconds passed first. If the
        event loop ends meanwhile (asyncio.run cancels every task before it waits for
        the executor's threads), the run is handed over to its threads' side."""
        try:
            try:
                if timeout is not None and on_timeout is not None:
                    try:
                        async with asyncio.timeout(timeout):
                            await threads.wait()
                    except TimeoutError:
                        await on_timeout()
                await threads.wait()
            except asyncio.CancelledError:
                if not self._hand_over(outliving, threads):
                    await outliving.settle()
                raise
            await outliving.settle()
        finally:
            if outliving.lease is not None:
                self._leases.drop(outliving.lease.run_id)

    async def _record_timeout(self, run: _Run) -> None:
        """A sync body outlasted its timeout: record it, keeping the lease (the job stays
        busy until the thread ends)."""
        spec = run.spec
        run.recorded = (
            "timeout",
            f"still running after timeout={spec.timeout:g} s "
            "(a thread cannot be cancelled; the next run waits for it)",
        )
        await self._finish(run, *run.recorded, body_ended=False)
        run.log.warning(
            'Job "%s" timed out: %s', spec.name, run.recorded[1], extra={"action": "job.timeout"}
        )

    async def _settle(self, run: _Run) -> None:
        """Record the end of a run's last thread: the body's outcome, or, when an
        outcome was recorded while its threads ran on, the release of its lease."""
        spec, raised = run.spec, run.raised
        if run.recorded is not None:
            if raised is not None:
                run.log.warning(
                    'Job "%s" raised after its timeout',
                    spec.name,
                    exc_info=raised,
                    extra={"action": "job.error"},
                )
            await self._release_lease(run)
            return
        if raised is not None:
            run.log.error(
                'Job "%s" raised', spec.name, exc_info=raised, extra={"action": "job.error"}
            )
        status, error = _outcome(raised)
        await self._finish(run, status, error)
        if run.detached:
            logger.warning(
                'Job "%s" ended in its thread after its run was cancelled: %s',
                spec.name,
                status,
                extra={
                    "action": "job.finished_after_demotion",
                    "job_id": spec.id,
                    "pid": self.store.pid,
                    "status": status,
                },
            )

    def _hand_over(self, outliving: _Outliving, threads: RunThreads) -> bool:
        """Leave a run whose threads still run to the threads' side (see threads.py): a
        keeper thread renews its lease and its last thread settles it. False when they
        have ended already, for the loop to settle it."""
        if not threads.hand_over(outliving.settle_in_thread):
            return False
        lease = outliving.lease
        if lease is not None:
            keep_lease(
                functools.partial(self.thread_store.renew_lease, lease, self.lease_seconds),
                period=self.lease_seconds / 3,
                until=threads.ended,
                job_id=lease.job_id,
                run_id=lease.run_id,
            )
        kind = outliving.kind
        logger.warning(
            '%s "%s" runs on in its threads as the event loop ends (shutdown); its running '
            "lease is renewed from a thread and its last thread settles it when it ends",
            kind.capitalize(),
            outliving.name,
            extra={
                "action": f"{kind}.outlived_event_loop",
                f"{kind}_id": outliving.id,
                "pid": self.store.pid,
            },
        )
        return True

    def _settle_in_thread(self, run: _Run) -> None:
        """Record a handed-over run's outcome, in its last thread as it ended. Never
        raises: the lease runs out by itself when the record fails."""
        spec = run.spec
        if run.raised is not None:
            run.log.error(
                'Job "%s" raised', spec.name, exc_info=run.raised, extra={"action": "job.error"}
            )
        # An outcome recorded while the threads ran on (a timeout, an async body's end)
        # is written again, in case the loop's record of it was cut short by its end.
        status, error = run.recorded or _outcome(run.raised)
        try:
            self.thread_store.finish(run.outcome(status, error, self.clock.now()))
        except Exception:
            logger.warning(
                'Could not record the outcome %s of job "%s" (run %s); its lease runs out '
                "by itself",
                status,
                spec.id,
                run.claim.run_id,
                exc_info=True,
                extra={"action": "job.record_failed", "job_id": spec.id},
            )
            return
        logger.warning(
            'Job "%s" ended in its thread after the event loop: %s',
            spec.name,
            status,
            extra={
                "action": "job.finished_after_shutdown",
                "job_id": spec.id,
                "pid": self.store.pid,
                "status": status,
            },
        )

    async def _release_service(self, lease: HeldLease) -> None:
        """Release a service copy's lease, its task and every thread it started having
        ended (a leader waiting to start the service is woken). Never raises: a lease
        not released runs out by itself."""
        try:
            await _until_it_lands(functools.partial(self.store.release_service_lease, lease))
        except Exception:
            _log_release_failed(lease)

    def _release_service_in_thread(self, lease: HeldLease) -> None:
        """_release_service from a handed-over copy's last thread, as it ended."""
        try:
            self.thread_store.release_service_lease(lease)
        except Exception:
            _log_release_failed(lease)

    def _hold_lease(self, run: _Run) -> None:
        # Renewed with every other lease of this process while the body runs here.
        if run.claim.leased:
            self._leases.hold(
                HeldLease(run.spec.id, run.claim.run_id, "run" if run.claim.replica else "job"),
                taken_at=run.claim.leased_at,
            )

    async def _release_lease(self, run: _Run) -> None:
        """Clear the lease of a run whose threads ended after its outcome was recorded
        (a thread past its timeout, an async body's threads), recording that outcome
        again if its record did not land."""
        assert run.recorded is not None, "released only after an outcome was recorded"
        try:
            async with asyncio.timeout(_RECORD_TIMEOUT):
                await self.store.release_lease(
                    run.outcome(*run.recorded, self.clock.now()), replica=run.claim.replica
                )
        except Exception:
            logger.warning(
                'Could not clear the running lease of job "%s" (run %s); it runs out by itself',
                run.spec.id,
                run.claim.run_id,
                exc_info=True,
                extra={"action": "job.record_failed", "job_id": run.spec.id},
            )

    async def _finish(
        self, run: _Run, status: str, error: str | None, *, body_ended: bool = True
    ) -> None:
        await self._record(run, status, error, body_ended=body_ended)
        self._observe(run.spec, status, time.perf_counter() - run.started, run.lateness)

    def _observe(self, spec: JobSpec, status: str, duration: float, lateness: timedelta) -> None:
        self.observers.run_finished(
            RunFinished(spec.id, status, duration, max(0.0, lateness.total_seconds()))
        )

    async def _record(self, run: _Run, status: str, error: str | None, *, body_ended: bool) -> None:
        # Shielded: a demotion that cancels the run mid-write must not lose the outcome
        # (the run would read 'running' for good); the write finishes in the background.
        await asyncio.shield(self._spawn(self._write_outcome(run, status, error, body_ended)))

    async def _write_outcome(
        self, run: _Run, status: str, error: str | None, body_ended: bool
    ) -> None:
        outcome = run.outcome(status, error, self.clock.now(), body_ended=body_ended)
        try:
            # Written with the outcomes of the other runs that end meanwhile.
            await _until_it_lands(functools.partial(self._outcomes.write, outcome))
        except Exception:
            logger.warning(
                'Could not record the outcome %s of job "%s" (run %s)',
                status,
                run.spec.id,
                run.claim.run_id,
                exc_info=True,
                extra={"action": "job.record_failed", "job_id": run.spec.id},
            )


async def _until_it_lands(write: Callable[[], Awaitable[None]]) -> None:
    """Call ``write()`` until it succeeds, for at most _RECORD_TIMEOUT; raise its last
    failure, or TimeoutError. A write cut off by a lost connection (a server restart, a
    terminated backend) would leave a run 'running', or a service's lease held, until
    the lease ran out: these writes are idempotent, so each is tried again, on a fresh
    connection, until it lands."""
    async with asyncio.timeout(_RECORD_TIMEOUT):
        for attempt in itertools.count(1):
            try:
                await write()
                return
            except Exception:
                logger.debug("a record failed; retrying", exc_info=True)
                await asyncio.sleep(OUTCOME_WRITE.delay(attempt))


@dataclass(frozen=True)
class _Outliving:
    """A run (``kind`` "job" or "service", ``id``, ``name``) whose lease holds until
    its threads end: the lease (None: it holds none), and how it is settled on the loop
    (``settle()``) and from its last thread once the loop is gone
    (``settle_in_thread()``)."""

    kind: str
    id: str
    name: str
    lease: HeldLease | None
    settle: Callable[[], Awaitable[None]]
    settle_in_thread: Callable[[], None]


@dataclass
class _Run:
    """One run in progress. ``detached``: its task was cancelled while its thread runs.
    ``recorded``: the outcome (status, error) recorded while its threads ran on (a
    thread body past its timeout, an async body that ended while threads it started
    ran): its lease is released when they end. ``raised``: what a sync body raised,
    set in its thread."""

    spec: JobSpec
    claim: Claim
    log: logging.LoggerAdapter[logging.Logger]
    started: float
    lateness: timedelta
    detached: bool = False
    recorded: tuple[str, str | None] | None = None
    raised: BaseException | None = None

    def duration_ms(self) -> int:
        """Milliseconds since the body started."""
        return int((time.perf_counter() - self.started) * 1000)

    def outcome(
        self, status: str, error: str | None, finished_at: datetime, *, body_ended: bool = True
    ) -> Outcome:
        """This run's outcome, ending now."""
        return Outcome(
            self.claim.run_id,
            self.spec.id,
            status,
            finished_at,
            self.duration_ms(),
            error,
            body_ended,
        )


def _outcome(raised: BaseException | None) -> tuple[str, str | None]:
    """A finished body's status and error."""
    return ("ok", None) if raised is None else ("error", format_error(raised))


def _adapter(name: str, job_id: str, pid: int) -> logging.LoggerAdapter[logging.Logger]:
    return logging.LoggerAdapter(logging.getLogger(name), {"job_id": job_id, "pid": pid})


def _log_release_failed(lease: HeldLease) -> None:
    """The warning for a service copy's lease that could not be released (call it from
    an except block: it logs the error being handled)."""
    logger.warning(
        'Could not release the running lease of service "%s" (copy %s); it runs out by itself',
        lease.job_id,
        lease.run_id,
        exc_info=True,
        extra={"action": "service.release_failed", "service_id": lease.job_id},
    )
