"""Jobs with ``leader_only=False``: every worker runs them, with no claim and no lock.

For idempotent per-replica sweeps. Each job keeps its slots in memory from this
worker's boot and never overlaps itself (the next slot waits for the run). What the
operator sees and can do:

- *Next run*: before waiting for a slot, each worker shows it on the job's row unless
  another worker's upcoming slot is sooner, so the row shows the soonest upcoming run.
- *Jitter*: each worker waits its own delay in [0, jitter) after a slot (a hash of the
  job, the slot and its pid, so workers spread apart); the run records it apart, and
  its lateness counts from the jittered fire time.
- *Pause*: every worker reads the row's pause flag at each slot and skips the slot
  while the job is paused.
- *Another release*: the row's ``leader_only`` is the newest registration's. While a
  leader of a release where the job is leader-only has registered it since this
  worker did, this worker skips its slots (that leader fires them); a leader of this
  release likewise leaves alone a leader job a newer worker registered per-worker.
- *Running*: each run holds a running lease on its own run row, renewed by its worker
  while the body runs, and its start shows the job's last status as ``running``; the
  job is listed running while any of those leases holds. A run whose worker died is
  reaped to ``abandoned`` once the lease passes, by the leader's tick or by the job's
  next run on any worker.
- *Run now* is refused (see app/operations/jobs.py): only the leader takes a run-now
  request, and it runs no per-worker job; each worker runs it at its own next slot.
- *Broken*: a slot this worker cannot compute or record is logged once as
  ``job.broken`` and recorded in ``scheduler_broken_jobs``; the job's loop retries
  after a minute and no other job's loop is touched.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from .broken import BrokenJobs
from .clock import Clock
from .faults import blames_job
from .loop import run_loop
from .registry import JobSpec
from .retry import BROKEN_JOB, DATABASE, log_retry
from .runner import Runner
from .store import JobStore
from .store.runs import format_error

__all__ = ["run_replica_jobs"]

logger = logging.getLogger("app.scheduler")


async def run_replica_jobs(
    specs: list[JobSpec],
    *,
    store: JobStore,
    runner: Runner,
    clock: Clock,
    zone: ZoneInfo,
    broken: BrokenJobs,
) -> None:
    """Run each job on its own schedule until cancelled; each registers its own row
    first, so one job that cannot be handled holds up no other (it is kept in
    ``broken``, the process's one book of broken jobs)."""
    async with asyncio.TaskGroup() as group:
        for spec in specs:
            loop = _ReplicaLoop(spec, store, runner, clock, zone, broken)
            group.create_task(loop.run(), name=f"replica-loop:{spec.id}")


class _ReplicaLoop:
    """One per-replica job on this worker: its slots, its pause check, its runs."""

    def __init__(
        self,
        spec: JobSpec,
        store: JobStore,
        runner: Runner,
        clock: Clock,
        zone: ZoneInfo,
        broken: BrokenJobs,
    ) -> None:
        self.spec = spec
        self.store = store
        self.runner = runner
        self.clock = clock
        self.zone = zone
        self.salt = str(store.pid)
        self.broken = broken

    async def run(self) -> None:
        """Register the job's row, then fire the job at each of its slots until
        cancelled; never raises otherwise. A passing outage is retried with backoff,
        a fault of the job's own every minute."""
        spec, now = self.spec, self.clock.now()
        slot: datetime | None = None
        if spec.first_run is not None:
            slot = now + timedelta(seconds=spec.first_run)
        registered, failures = False, 0

        async def step() -> float:
            nonlocal slot, registered, failures
            try:
                if not registered:
                    await self.store.register_replica_job(spec, self.clock.now(), self.zone)
                    registered = True
                if slot is None:
                    slot = spec.trigger.first_slot(self.clock.now(), self.zone)
                slot = await self.run_once(slot)
                failures = 0
                if spec.id in self.broken:
                    await self.broken.repaired([spec.id])
                return 0.0
            except Exception as exc:
                slot = None
                if await blames_job(self.store.engine, exc):
                    await self.broken.mark(spec.id, format_error(exc))
                    return BROKEN_JOB.delay(1)
                failures += 1
                delay = DATABASE.delay(failures)
                log_retry("scheduler.replica_job_waiting", exc, delay)
                return delay

        await run_loop(step, self.clock)

    async def run_once(self, slot: datetime) -> datetime:
        """Show ``slot``, wait for its jittered fire time, run it unless the job is
        paused; return the next slot."""
        spec = self.spec
        await self.store.show_replica_slot(spec.id, slot, self.clock.now())
        jitter = spec.jitter_delay(slot, salt=self.salt)
        await self.clock.sleep((slot - self.clock.now()).total_seconds() + jitter)
        latest, _ = spec.trigger.latest_slot(slot, self.clock.now(), self.zone)
        next_slot = spec.trigger.next_after(latest, self.zone)
        rows = await self.store.load([spec.id])
        # A leader of a release where the job is leader-only registered it after this
        # worker did: that leader fires it now, and this worker only waits out the slot.
        if spec.id in rows and not rows[spec.id].paused and not rows[spec.id].leader_only:
            await self.runner.fire_replica(
                spec, latest, jitter=spec.jitter_delay(latest, salt=self.salt)
            )
        return next_slot
