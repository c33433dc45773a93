"""Jobs with ``leader_only=False``: every worker runs them, with no claim and no lock.

For idempotent per-replica sweeps. Each job keeps its slots in memory from this
worker's boot and never overlaps itself (the next slot waits for the run).
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import timedelta
from zoneinfo import ZoneInfo

from .clock import Clock
from .registry import JobSpec
from .retry import backoff_delay, log_retry
from .runner import Runner
from .store import JobStore

__all__ = ["run_replica_jobs"]

logger = logging.getLogger("app.scheduler")


async def run_replica_jobs(
    specs: list[JobSpec], *, store: JobStore, runner: Runner, clock: Clock, zone: ZoneInfo
) -> None:
    """Register the jobs' rows (retrying while the database is away), then run each on
    its schedule until cancelled."""
    if not specs:
        return
    failures = 0
    while True:
        try:
            await store.register_replica_jobs(specs, clock.now(), zone)
            break
        except Exception as exc:
            delay = backoff_delay(failures)
            failures += 1
            log_retry("scheduler.replica_jobs_waiting", exc, delay)
            await clock.sleep(delay)
    async with asyncio.TaskGroup() as group:
        for spec in specs:
            group.create_task(_loop(spec, runner, clock, zone), name=f"replica-loop:{spec.id}")


async def _loop(spec: JobSpec, runner: Runner, clock: Clock, zone: ZoneInfo) -> None:
    now = clock.now()
    first_run = now + timedelta(seconds=spec.first_run) if spec.first_run is not None else None
    slot = first_run or spec.trigger.first_slot(now, zone)
    while True:
        jitter = random.uniform(0, spec.jitter) if spec.jitter else 0.0
        await clock.sleep((slot - clock.now()).total_seconds() + jitter)
        latest, _ = spec.trigger.latest_slot(slot, clock.now(), zone)
        try:
            await runner.fire_replica(spec, latest)
        except Exception:
            logger.warning("replica job %s could not start", spec.id, exc_info=True)
        slot = spec.trigger.next_after(latest, zone)
