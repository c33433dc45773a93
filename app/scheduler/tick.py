"""The leader's tick: every LEADER_TICK_SECONDS (or at a NOTIFY that rows changed),
check the key is still held, bring in the rows others changed, reap the running
leases of dead owners and say that this leader still fires."""

from __future__ import annotations

import asyncio
import logging

from .broken import BrokenJobs
from .clock import Clock
from .config import SchedulerConfig
from .loop import Stop, run_loop
from .rows import LeaderRows
from .runner import Runner
from .store import JobStore, format_error
from .tenure import LeadershipEnd, Tenure

__all__ = ["LeaderTick"]

logger = logging.getLogger("app.scheduler")


class LeaderTick:
    """One leadership's tick. It owns ``reload``: set by a NOTIFY on the lock
    connection that rows changed, it wakes the tick at once."""

    def __init__(
        self,
        tenure: Tenure,
        rows: LeaderRows,
        *,
        job_ids: list[str],
        runner: Runner,
        store: JobStore,
        broken: BrokenJobs,
        clock: Clock,
        config: SchedulerConfig,
    ) -> None:
        self._tenure = tenure
        self._rows = rows
        self._job_ids = job_ids
        self._runner = runner
        self._store = store
        self._broken = broken
        self._clock = clock
        self._config = config
        self.reload = asyncio.Event()

    async def run(self, until: float | None, timer: asyncio.Task[None]) -> LeadershipEnd:
        """Tick until the leadership ends (the key lost or no longer held, stop(), or
        ``until``, on Clock.monotonic, for an unguarded one) and return how it ended.
        Never raises for a failed reload (logged, retried a tick later). When the job
        ``timer`` has died, every leader job is marked broken."""
        tenure = self._tenure
        tick = self._config.leader_tick_seconds

        async def step() -> float | Stop[LeadershipEnd]:
            self.reload.clear()
            if tenure.lost.is_set():
                return Stop(LeadershipEnd.CONNECTION_LOST)
            if tenure.stopping.is_set():
                return Stop(LeadershipEnd.STOPPED)
            if until is not None and self._clock.monotonic() >= until:
                return Stop(LeadershipEnd.UNGUARDED_PERIOD_OVER)
            if not await tenure.holds_lock():
                return Stop(LeadershipEnd.NO_LONGER_HELD)
            if await self.run_once() and timer.done():
                # A bug, not a passing fault (a wake's failure is retried): no leader
                # job fires for the rest of this leadership, so each is marked broken
                # (health says so) until a later registration or claim of it succeeds.
                death = _loop_death(timer)
                for job_id in self._job_ids:
                    if job_id not in self._broken:
                        await self._broken.mark(job_id, death)
            return tick

        return await run_loop(
            step,
            self._clock,
            first_delay=tick,
            wakes=[tenure.lost.wait, tenure.stopping.wait, self.reload.wait],
        )

    async def run_once(self) -> bool:
        """Pick up what others changed (pause, resume, run now) since the last tick,
        reap the running leases whose owners died, and say that we still fire. False
        (logged) when the database failed it."""
        try:
            for job_id in await self._rows.reload(self._store):
                # A body claimed ahead of its slot does not begin once the pause is seen.
                self._runner.drop_for_pause(job_id)
            for job_id in await self._store.reap(self._clock.now(), self._runner.renewing):
                logger.warning(
                    "job.abandoned: the running lease of job %s ran out (its owner died)",
                    job_id,
                    extra={"action": "job.abandoned", "job_id": job_id},
                )
            if self._tenure.fence is not None:
                await self._store.heartbeat(self._tenure.fence, self._clock.now())
        except Exception:
            logger.warning("scheduler: could not reload the job rows", exc_info=True)
            return False
        return True


def _loop_death(loop: asyncio.Task[None]) -> str:
    """Why the job timer, which should run for the whole leadership, ended."""
    if loop.cancelled():
        return "the job timer was cancelled while this worker leads"
    exc = loop.exception()
    return format_error(exc) if exc is not None else "the job timer returned"
