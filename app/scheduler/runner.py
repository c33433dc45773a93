"""One fire of one job: claim the slot, run the body, record the outcome.

Async bodies run on the event loop; sync bodies run through ``asyncio.to_thread`` and
never on the loop. The runner opens the job's sessions lazily, commits them when the
body returns normally, and always closes them (rolling back whatever is uncommitted).
A body that raises is logged with its traceback and recorded as ``error``; it never
reaches the supervisor, so the next slot still fires.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .clock import Clock
from .context import JobContext, ServiceContext
from .errors import SchedulerError
from .events import Observers, RunFinished
from .registry import JobSpec, ServiceSpec
from .store import JobStore, format_error
from .triggers import COUNTED_SLOTS

__all__ = ["Claim", "Runner"]

logger = logging.getLogger("app.scheduler")

_RECORD_TIMEOUT = 10.0
_SERVICE_BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


@dataclass(frozen=True)
class Claim:
    """A slot this process won: its run row, the slot run, and the job's next slot."""

    run_id: int
    slot: datetime
    next_slot: datetime
    runs: bool


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


class Runner:
    """Runs fires for one process. Stateless between fires; the supervisor owns timing."""

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Clock,
        zone: ZoneInfo,
        sessions: async_sessionmaker[AsyncSession],
        sync_sessions: sessionmaker[Session],
        observers: Observers | None = None,
    ) -> None:
        self.observers = observers or Observers()
        self.store = store
        self.clock = clock
        self.zone = zone
        self.sessions = sessions
        self.sync_sessions = sync_sessions

    async def claim_leader(
        self, spec: JobSpec, due: datetime, fence_pid: int | None
    ) -> Claim | None:
        """Claim slot ``due`` of a leader-only job; the claim commits before any body runs.

        Late slots coalesce into one run of the latest slot; with ``misfire_grace`` a
        slot later than the grace is claimed as ``missed`` instead of run. Returns None
        when the claim matched nothing: another process fired the slot, the job is
        paused, or this process no longer holds the lock.
        """
        now = self.clock.now()
        latest, passed = spec.trigger.latest_slot(due, now, self.zone)
        next_slot = spec.trigger.next_after(latest, self.zone)
        grace = spec.misfire_grace
        missed = grace is not None and (now - latest).total_seconds() > grace
        error = missed_before = None
        # Past COUNTED_SLOTS the trigger stopped counting: the note says "at least".
        at_least = "at least " if passed >= COUNTED_SLOTS else ""
        if missed:
            error = f"{at_least}{passed + 1} slot(s) later than misfire_grace ({grace:g} s) skipped"
        elif grace is not None and passed:
            missed_before = (
                due,
                f"{at_least}{passed} slot(s) later than misfire_grace ({grace:g} s)",
            )
        run_id = await self.store.claim(
            spec,
            due=due,
            next_slot=next_slot,
            run_slot=latest,
            now=now,
            status="missed" if missed else "running",
            fence_pid=fence_pid,
            error=error,
            missed_before=missed_before,
        )
        if run_id is None:
            return None
        if missed:
            logger.warning(
                'Missed job "%s" (id=%s, slot=%s, pid=%s)',
                spec.name,
                spec.id,
                latest.isoformat(),
                self.store.pid,
                extra={"action": "job.missed", "job_id": spec.id, "pid": self.store.pid},
            )
            self._observe(spec, "missed", 0.0, now - latest)
        return Claim(run_id, latest, next_slot, runs=not missed)

    async def skip_overlap(
        self, spec: JobSpec, due: datetime, fence_pid: int | None
    ) -> Claim | None:
        """Claim slot ``due`` while the job still runs, recorded as skipped_overlap."""
        now = self.clock.now()
        latest, _ = spec.trigger.latest_slot(due, now, self.zone)
        next_slot = spec.trigger.next_after(latest, self.zone)
        run_id = await self.store.claim(
            spec,
            due=due,
            next_slot=next_slot,
            run_slot=latest,
            now=now,
            status="skipped_overlap",
            fence_pid=fence_pid,
            error="the previous run was still going",
        )
        if run_id is None:
            return None
        self._observe(spec, "skipped_overlap", 0.0, now - latest)
        return Claim(run_id, latest, next_slot, runs=False)

    async def fire_replica(self, spec: JobSpec, slot: datetime) -> None:
        """Run a per-replica job's slot on this worker: no claim, no lock."""
        run_id = await self.store.start_replica_run(spec, slot, self.clock.now())
        await self.execute(spec, Claim(run_id, slot, slot, runs=True))

    async def run_service(self, spec: ServiceSpec) -> None:
        """Run a leader-only service until cancelled, restarting it with backoff when it
        crashes or returns."""
        log = _adapter(f"app.services.{spec.id}", spec.id, self.store.pid)
        failures = 0
        while True:
            ctx = ServiceContext(spec.id, spec.name, self.clock, log, self.sessions)
            log.info(
                'Starting service "%s" (id=%s, pid=%s)',
                spec.name,
                spec.id,
                self.store.pid,
                extra={"action": "service.started"},
            )
            try:
                await spec.func(ctx)
                log.warning('Service "%s" returned; restarting it', spec.name)
            except asyncio.CancelledError:
                log.info('Service "%s" stopped', spec.name, extra={"action": "service.stopped"})
                raise
            except Exception:
                log.exception(
                    'Service "%s" crashed; restarting it',
                    spec.name,
                    extra={"action": "service.crashed"},
                )
            delay = _SERVICE_BACKOFF[min(failures, len(_SERVICE_BACKOFF) - 1)]
            failures += 1
            await self.clock.sleep(delay)

    async def execute(self, spec: JobSpec, claim: Claim) -> None:
        """Run the body of a claimed slot and record how it ended. Never raises but
        CancelledError (recorded as ``cancelled`` first)."""
        pid, slot, run_id = self.store.pid, claim.slot, claim.run_id
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
            _sessions=self.sessions if spec.is_async else None,
            _sync_sessions=None if spec.is_async else self.sync_sessions,
        )
        started = time.perf_counter()
        lateness = self.clock.now() - slot
        status, error = "ok", None
        thread: asyncio.Future[None] | None = None
        try:
            if spec.is_async:
                try:
                    async with asyncio.timeout(spec.timeout) as deadline:
                        await spec.func(ctx)
                        await ctx.commit()
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    status, error = "timeout", f"cancelled after timeout={spec.timeout:g} s"
                finally:
                    await ctx.aclose()
            else:
                thread = asyncio.ensure_future(asyncio.to_thread(_run_in_thread, spec.func, ctx))
                done, _ = await asyncio.wait({thread}, timeout=spec.timeout)
                if thread in done:
                    thread.result()
                else:
                    status = "timeout"
                    error = (
                        f"still running after timeout={spec.timeout:g} s "
                        "(a thread cannot be cancelled; the next run waits for it)"
                    )
        except asyncio.CancelledError:
            status, error = "cancelled", "cancelled: this worker stopped leading or shut down"
            if thread is not None and not thread.done():
                # The thread runs on; whatever it ends with is logged, not lost.
                thread.add_done_callback(functools.partial(_log_abandoned, spec))
            await self._record(spec, run_id, status, started, error)
            self._observe(spec, status, time.perf_counter() - started, lateness)
            raise
        except Exception as exc:
            status, error = "error", format_error(exc)
            log.exception('Job "%s" raised', spec.name, extra={"action": "job.error"})
        await self._record(spec, run_id, status, started, error)
        self._observe(spec, status, time.perf_counter() - started, lateness)
        if status == "timeout":
            log.warning('Job "%s" timed out: %s', spec.name, error, extra={"action": "job.timeout"})
            if thread is not None:
                # The job stays busy until its thread ends, so it never overlaps itself.
                await asyncio.wait({thread})
                if not thread.cancelled() and thread.exception() is not None:
                    log.warning(
                        'Job "%s" raised after its timeout',
                        spec.name,
                        exc_info=thread.exception(),
                        extra={"action": "job.error"},
                    )

    def _observe(self, spec: JobSpec, status: str, duration: float, lateness: timedelta) -> None:
        self.observers.run_finished(
            RunFinished(spec.id, status, duration, max(0.0, lateness.total_seconds()))
        )

    async def _record(
        self, spec: JobSpec, run_id: int, status: str, started: float, error: str | None
    ) -> None:
        duration_ms = int((time.perf_counter() - started) * 1000)
        try:
            async with asyncio.timeout(_RECORD_TIMEOUT):
                await self.store.finish(
                    run_id,
                    spec.id,
                    status=status,
                    finished_at=self.clock.now(),
                    duration_ms=duration_ms,
                    error=error,
                )
        except Exception:
            logger.warning(
                'Could not record the outcome %s of job "%s" (run %s)',
                status,
                spec.id,
                run_id,
                exc_info=True,
                extra={"action": "job.record_failed", "job_id": spec.id},
            )


def _log_abandoned(spec: JobSpec, thread: asyncio.Future[None]) -> None:
    if not thread.cancelled() and thread.exception() is not None:
        logger.warning(
            'Job "%s" raised in its thread after the run was cancelled',
            spec.name,
            exc_info=thread.exception(),
            extra={"action": "job.error", "job_id": spec.id},
        )


def _adapter(name: str, job_id: str, pid: int) -> logging.LoggerAdapter[logging.Logger]:
    return logging.LoggerAdapter(logging.getLogger(name), {"job_id": job_id, "pid": pid})
