"""A run's outcome on its way to the database: written (with the outcomes of the other
runs that end meanwhile, tried again until it lands), counted for the observers,
settled when a run's last thread ends (on the loop, or from that thread once the loop
is gone), and a service copy's lease released."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from .batching import OutcomeWriter
from .carried import Carried
from .claiming import Claim
from .clock import Clock
from .events import Observers, RunFinished
from .registry import JobSpec
from .retry import OUTCOME_WRITE
from .store import HeldLease, JobStore, Outcome, ThreadStore, format_error

__all__ = ["Recorder", "Run"]

logger = logging.getLogger("app.scheduler")

_RECORD_TIMEOUT = 10.0


class Recorder:
    """Writes the outcomes of one process's runs and releases their leases; each write
    is carried to its end (``carried``, which the runner waits for before the engine
    goes)."""

    def __init__(
        self,
        store: JobStore,
        thread_store: ThreadStore,
        *,
        clock: Clock,
        observers: Observers,
        carried: Carried,
    ) -> None:
        self.store = store
        self.thread_store = thread_store
        self.clock = clock
        self.observers = observers
        self._outcomes = OutcomeWriter(store)
        self._carried = carried

    def spawn(self, write: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run an outcome write to its end whatever happens to the task that asked for
        it (a demotion cancels that task; the write must still land)."""
        return self._carried.spawn(write)

    async def settle(self, run: Run) -> None:
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
        await self.finish(run, status, error)
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

    def settle_in_thread(self, run: Run) -> None:
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

    async def release_service(self, lease: HeldLease) -> None:
        """Release a service copy's lease, its task and every thread it started having
        ended (a leader waiting to start the service is woken). Never raises: a lease
        not released runs out by itself."""
        try:
            await _until_it_lands(functools.partial(self.store.release_service_lease, lease))
        except Exception:
            _log_release_failed(lease)

    def release_service_in_thread(self, lease: HeldLease) -> None:
        """release_service from a handed-over copy's last thread, as it ended."""
        try:
            self.thread_store.release_service_lease(lease)
        except Exception:
            _log_release_failed(lease)

    async def _release_lease(self, run: Run) -> None:
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

    async def finish(
        self, run: Run, status: str, error: str | None, *, body_ended: bool = True
    ) -> None:
        """Record the run's outcome (the write lands even when the caller is cancelled
        meanwhile) and count it; ``body_ended`` False keeps its lease held (its
        threads run on)."""
        await self._record(run, status, error, body_ended=body_ended)
        self.observe(run.spec, status, time.perf_counter() - run.started, run.lateness)

    def observe(self, spec: JobSpec, status: str, duration: float, lateness: timedelta) -> None:
        """Tell the observers that a run of ``spec`` ended with ``status``."""
        self.observers.run_finished(
            RunFinished(spec.id, status, duration, max(0.0, lateness.total_seconds()))
        )

    async def _record(self, run: Run, status: str, error: str | None, *, body_ended: bool) -> None:
        # Shielded: a demotion that cancels the run mid-write must not lose the outcome
        # (the run would read 'running' for good); the write finishes in the background.
        await asyncio.shield(self.spawn(self._write_outcome(run, status, error, body_ended)))

    async def _write_outcome(
        self, run: Run, status: str, error: str | None, body_ended: bool
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


@dataclass
class Run:
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
