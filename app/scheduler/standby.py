"""The standby's watch of the live leader's jobs: a leader of another app of the same
schedule name leaves some of this worker's jobs and services unrun."""

from __future__ import annotations

import logging
import os

from .clock import Clock
from .config import Role
from .loop import run_loop
from .registry import Registry
from .roles import RoleState
from .store import JobStore, LeaderJobs

__all__ = ["LeaderJobsWatch"]

logger = logging.getLogger("app.scheduler")


class LeaderJobsWatch:
    """Watches, while the worker stands by, which of its leader-only jobs and services
    the live leader does not run. It owns ``unled_jobs``."""

    def __init__(
        self,
        registry: Registry,
        *,
        store: JobStore,
        roles: RoleState,
        clock: Clock,
        tick_seconds: float,
    ) -> None:
        self._registry = registry
        self._store = store
        self._roles = roles
        self._clock = clock
        self._tick_seconds = tick_seconds
        # Ids of the leader-only jobs and the services of this worker that the live
        # leader of its schedule does not run (another app of the same name leads):
        # they run nowhere.
        self.unled_jobs: list[str] = []

    async def run(self) -> None:
        """While a standby, every leader tick: compare this worker's leader-only jobs
        and services with the ones the live leader of its schedule recorded. Those it
        lacks run nowhere (another app of the same name leads), so say so once per
        change (``scheduler.jobs_not_led``, then ``scheduler.jobs_led`` once they are
        led again) and keep their ids in ``unled_jobs`` for /health/scheduler. Never
        raises."""
        jobs = {spec.id for spec in self._registry.jobs.values() if spec.leader_only}
        services = set(self._registry.services)
        if not jobs and not services:
            return

        async def step() -> float:
            if self._roles.role is not Role.STANDBY:
                self._set_unled([], None)
                # Only a standby asks (and sleeps on the clock): a leader fires its own.
                await self._roles.until(lambda role: role is Role.STANDBY)
            unled, leader = self.unled_jobs, None
            try:
                leader = await self._store.leader_jobs()
            except Exception:
                logger.debug("scheduler: could not read the leader's jobs", exc_info=True)
            # No live recorded leader (a handover, a failed read): nothing new is known.
            if leader is not None:
                # A leader of a release that records no services: nothing is known.
                led_services = services if leader.service_ids is None else leader.service_ids
                unled = sorted((jobs - leader.job_ids) | (services - led_services))
            self._set_unled(unled, leader)
            return self._tick_seconds

        await run_loop(
            step,
            self._clock,
            wakes=[lambda: self._roles.until(lambda role: role is not Role.STANDBY)],
        )

    def _set_unled(self, unled: list[str], leader: LeaderJobs | None) -> None:
        if unled != self.unled_jobs:
            self._report_unled(unled, leader)
            self.unled_jobs = unled

    def _report_unled(self, unled: list[str], leader: LeaderJobs | None) -> None:
        schedule, pid = self._store.schedule, os.getpid()
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
