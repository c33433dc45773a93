"""One process's runs: which jobs have a body running here, starting a claimed slot
(gated until its instant when claimed ahead, dropped when its job is paused first),
a per-worker fire, and waiting for every body at shutdown. Its parts: claiming.py (the
claim), bodies.py (a body's run), recording.py (its outcome), outlast.py (threads
that outlive a run), service_copies.py (a leader's service copies).

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

The same watch (``Outlast.outlast``: the one rule for work that outlives its cancellation)
keeps the lease of an async body, and of a service copy, whose threads
(``asyncio.to_thread``, seen through threads.RunThreads) run on after its task ended:
renewed until they end, then released; handed over the same way if the loop ends
first. A service copy's lease is on its own row (named on its service's row), taken
by the leader before the copy starts (``ServiceCopies.take_lease``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from datetime import datetime
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .batching import LeaseKeeper
from .bodies import Bodies
from .carried import Carried
from .claiming import Claim, Claimer, Due
from .clock import Clock
from .context import job_log
from .events import Observers
from .outlast import Outlast
from .recording import Recorder, Run
from .registry import JobSpec
from .service_copies import ServiceCopies
from .store import JobStore, PreparedCommit, ThreadStore

__all__ = ["Claim", "Due", "Runner"]

logger = logging.getLogger("app.scheduler")

_CANCELLED_BEFORE_START = (
    "cancelled before its body started: this worker stopped leading or shut down"
)
_PAUSED_BEFORE_START = "cancelled before its body started: the job was paused before its slot"


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
        # Per job, the task of a body started ahead of its slot, until it begins; and
        # those cancelled because the job was paused meanwhile.
        self._waiting: dict[str, asyncio.Task[None]] = {}
        self._paused_before_start: dict[str, asyncio.Task[None]] = {}
        # The statements carried past a cancel (writes, renewals, takes): awaited before
        # the engine goes (wait_for_bodies).
        self._carried = Carried()
        self._leases = LeaseKeeper(
            store, clock=clock, lease_seconds=lease_seconds, carried=self._carried
        )
        self._recorder = Recorder(
            store, self.thread_store, clock=clock, observers=self.observers, carried=self._carried
        )
        self._outlast = Outlast(
            self._leases, self.thread_store, lease_seconds=lease_seconds, pid=store.pid
        )
        # The bodies running in this process, and which jobs they are of.
        self.bodies = Bodies(
            pid=store.pid,
            schedule=store.schedule,
            clock=clock,
            zone=zone,
            sessions=sessions,
            sync_sessions=sync_sessions,
            leases=self._leases,
            recorder=self._recorder,
            outlast=self._outlast,
        )
        self.claims = Claimer(
            store,
            clock=clock,
            zone=zone,
            lease_seconds=lease_seconds,
            busy_here=self.bodies.is_running,
            renewing=lambda: self._leases.renewing,
            observe=self._recorder.observe,
        )
        # This process's service copies (a leader's), and their threads that outlive them.
        self.services = ServiceCopies(
            store,
            clock=clock,
            sessions=sessions,
            lease_seconds=lease_seconds,
            leases=self._leases,
            recorder=self._recorder,
            outlast=self._outlast,
            carried=self._carried,
        )

    @property
    def running_job_ids(self) -> set[str]:
        """Ids of the jobs whose body runs in this process now, whoever leads."""
        return self.bodies.running_job_ids

    def is_running(self, job_id: str) -> bool:
        """True while a body of the job runs in this process (a thread may outlive the
        run's task and this worker's leadership)."""
        return self.bodies.is_running(job_id)

    @property
    def outliving_service_ids(self) -> set[str]:
        """Ids of the services whose stopped copy left threads running in this process."""
        return self.services.outliving_ids

    async def wait_for_bodies(self) -> None:
        """Return once no job body and no thread of a stopped service copy runs in this
        process, each run recorded with its outcome and each copy's lease released, the
        run cancelled before its body started too (its record is a write of its own),
        and every other statement carried past a cancel ended (a renewal, a copy's lease
        take cut off by the stop): the app disposes the engine next, and a statement
        holding a pool connection across that would leak it. A thread that outlived its
        run's task keeps its lease renewed meanwhile."""
        while pending := [
            *self.bodies.pending,
            *self.services.pending,
            *self._carried.pending,
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
        self.bodies.alive(spec.id, task)
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
        log = job_log(spec, self.store.pid)
        run = Run(spec, claim, log, time.perf_counter(), self.clock.now() - claim.slot)
        error = _PAUSED_BEFORE_START if paused else _CANCELLED_BEFORE_START
        self._recorder.spawn(self._recorder.finish(run, "cancelled", error))

    def drop_for_pause(self, job_id: str) -> None:
        """The job was paused: its body started ahead of its slot (start(gate=...)) that
        has not begun yet never begins; its run is recorded cancelled."""
        task = self._waiting.get(job_id)
        if task is not None and not task.done():
            self._paused_before_start[job_id] = task
            task.cancel()

    @property
    def renewing(self) -> frozenset[int]:
        """The runs whose running lease this process renews now (its LeaseKeeper's):
        every reap it makes leaves them alone, since their bodies run here."""
        return self._leases.renewing

    async def claim_many(
        self, dues: Sequence[Due], fence_pid: int | None, prepared: PreparedCommit | None = None
    ) -> list[Claim | Exception | None]:
        """Claim every slot and run-now request in ``dues`` (one per job) in one commit:
        Claimer.claim_many, planned with the bodies running in this process."""
        return await self.claims.claim_many(dues, fence_pid, prepared)

    async def fire_replica(self, spec: JobSpec, slot: datetime, *, jitter: float = 0.0) -> int:
        """Run a per-replica job's slot on this worker: no claim, no lock; the run holds
        a running lease on its own run row, renewed as a leader run's. Runs of the job
        whose worker died are reaped as it starts. ``jitter``: the seconds this worker
        waited after the slot by design. Returns the run's id once its outcome is
        recorded (a thread past its timeout may still run)."""
        now, leased_at = self.clock.now(), self.clock.monotonic()
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
            run_id,
            slot,
            slot,
            runs=True,
            leased=True,
            jitter=jitter,
            replica=True,
            leased_at=leased_at,
        )
        await self.execute(spec, claim)
        return run_id

    async def execute(self, spec: JobSpec, claim: Claim) -> None:
        """Run the body of a claimed slot and record how it ended (Bodies.execute).
        Never raises but CancelledError."""
        await self.bodies.execute(spec, claim)
