"""One leadership, from promotion to step-down: the handover grace and the term
(tenure.py), the registration of its job rows, then its job timer, its services and
its tick until it ends; at the end its loops stop and its bodies get the shutdown
grace (when it still owns the schedule) before the key is given back.

A Leadership is made per promotion and owns the parts of that leadership: one Tenure,
one LeaderRows, one LeaderTick, one Setbacks and one JobTimer. None of them outlives
it, so no state of one leadership reaches the next."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from .ahead import CommitCost
from .broken import BrokenJobs
from .clock import Clock
from .config import SchedulerConfig
from .election import LockConnection
from .registration import refresh_statistics, register_leader_rows, settle_retirement
from .registry import JobSpec, Registry
from .rows import LeaderRows
from .runner import Runner
from .services import run_service_after
from .setbacks import Setbacks
from .store import JobStore
from .tenure import LeadershipEnd, Tenure
from .tick import LeaderTick
from .waits import first
from .wake import JobTimer

__all__ = ["Leadership"]


class Leadership:
    """One leadership of ``lock`` (None: unguarded, for one period, no services) over
    ``leader_jobs`` and the registry's services.
    ``stopping`` and ``firing`` are the worker's, only read here."""

    def __init__(
        self,
        lock: LockConnection | None,
        *,
        leader_jobs: list[JobSpec],
        registry: Registry,
        runner: Runner,
        store: JobStore,
        broken: BrokenJobs,
        committing: CommitCost,
        clock: Clock,
        config: SchedulerConfig,
        stopping: asyncio.Event,
        firing: asyncio.Event,
    ) -> None:
        self.lock = lock
        self.leader_jobs = leader_jobs
        self.registry = registry
        self.runner = runner
        self.store = store
        self.broken = broken
        self.committing = committing
        self.clock = clock
        self.config = config
        self.stopping = stopping
        self.firing = firing
        self.tenure = Tenure(lock, store=store, config=config, clock=clock, stopping=stopping)
        # Set once the job rows are registered; None until then.
        self.timer: JobTimer | None = None
        self._tick: LeaderTick | None = None
        self._loops: list[asyncio.Task[None]] = []

    async def begin(self) -> LeadershipEnd | None:
        """The handover grace, the term, the registration of the job rows, then start
        the job timer and the services. None once they run; else how the leadership
        ended before it fired. Raises what the registration raises when the database
        does not answer (the worker backs off)."""
        tenure, lock = self.tenure, self.lock
        grace_ends = self.clock.monotonic() + self.config.handover_grace_seconds
        if not await tenure.handover(grace_ends):
            return LeadershipEnd.LOST_DURING_HANDOVER
        if self.stopping.is_set():
            return LeadershipEnd.STOPPED
        now = self.clock.now()
        leader_jobs = self.leader_jobs
        job_ids = [spec.id for spec in leader_jobs]
        if lock is not None and not await tenure.begin_term(
            now, job_ids, list(self.registry.services)
        ):
            return (
                LeadershipEnd.STOPPED if self.stopping.is_set() else LeadershipEnd.LOST_BEFORE_TERM
            )
        registered = await register_leader_rows(
            leader_jobs, store=self.store, broken=self.broken, zone=self.config.zone, now=now
        )
        await settle_retirement(self.store, self.registry.jobs, registered.stored)
        rows = LeaderRows(
            registered.rows,
            registered.horizon,
            specs=self.registry.jobs,
            clock=self.clock,
            claim_ahead=timedelta(seconds=self.config.claim_ahead_seconds),
            tick_seconds=self.config.leader_tick_seconds,
        )
        self._tick = LeaderTick(
            tenure,
            rows,
            job_ids=job_ids,
            runner=self.runner,
            store=self.store,
            broken=self.broken,
            clock=self.clock,
            config=self.config,
        )
        if lock is not None:
            await lock.on_wake(self._tick.reload.set)
        self.timer = self._job_timer(leader_jobs, rows)
        self._loops = [asyncio.create_task(self.timer.run(), name="leader-jobs-timer")]
        if lock is not None:
            # Services (long-poll consumers) run on one process at most: never
            # unguarded, where another worker may lead.
            self._loops += self._services(grace_ends, lock)
        if registered.grew:
            # Beside the timer and the tick, neither of which it may hold up.
            self._loops.append(
                asyncio.create_task(refresh_statistics(self.store), name="leader-jobs-analyze")
            )
        return None

    async def lead(self, until: float | None) -> LeadershipEnd:
        """Tick until the leadership ends (begun first; ``until``, on Clock.monotonic, for
        an unguarded one) and return how it ended."""
        assert self._tick is not None, "lead() follows a begin() that started the loops"
        ticking = asyncio.ensure_future(self._tick.run(until, self._loops[0]))
        # A tick's statements may wait on the database (a row lock, the pool): a lost
        # lock connection ends the leadership without waiting for them, since the
        # next leader starts its services once its grace is over.
        lost = await first(ticking, self.tenure.lost.wait()) == 1
        return LeadershipEnd.CONNECTION_LOST if lost else ticking.result()

    async def step_down(self, end: LeadershipEnd) -> None:
        """Stop the loops; give running bodies the shutdown grace when ``end`` still
        owns the schedule, then cancel them; give the key back."""
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self.timer is not None and self.timer.bodies:
            if end.graceful:
                await self.tenure.shutdown_grace(self.timer.bodies)
            await self.timer.cancel_bodies()
        await self.tenure.end()

    def _job_timer(self, leader_jobs: list[JobSpec], rows: LeaderRows) -> JobTimer:
        setbacks = Setbacks(
            rows, store=self.store, broken=self.broken, tick_seconds=self.config.leader_tick_seconds
        )
        return JobTimer(
            leader_jobs,
            rows,
            tenure=self.tenure,
            setbacks=setbacks,
            runner=self.runner,
            store=self.store,
            broken=self.broken,
            committing=self.committing,
            clock=self.clock,
            config=self.config,
        )

    def _services(self, grace_ends: float, lock: LockConnection) -> list[asyncio.Task[None]]:
        return [
            asyncio.create_task(
                run_service_after(
                    spec,
                    grace_ends,
                    lock,
                    copies=self.runner.services,
                    clock=self.clock,
                    tick_seconds=self.config.leader_tick_seconds,
                    firing=self.firing,
                ),
                name=f"service:{spec.id}",
            )
            for spec in self.registry.services.values()
        ]
