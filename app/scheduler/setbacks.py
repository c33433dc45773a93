"""What the leader does when a step of one of its jobs fails (its registration or its
claim): the job's fault marks it broken, a row held elsewhere is tried again soon, a
passing outage a tick later. Its other jobs are never held up."""

from __future__ import annotations

import logging
import os

from .broken import BrokenJobs
from .errors import JobRowBusyError
from .faults import blames_job, is_busy_row
from .retry import BROKEN_JOB, BUSY_ROW
from .rows import LeaderRows
from .store import JobStore, format_error

__all__ = ["Setbacks"]

logger = logging.getLogger("app.scheduler")


class Setbacks:
    """One leadership's failed job steps. It owns the busy book: the jobs whose last
    claims met their row held elsewhere, and how many in a row."""

    def __init__(
        self, rows: LeaderRows, *, store: JobStore, broken: BrokenJobs, tick_seconds: float
    ) -> None:
        self._rows = rows
        self._store = store
        self._broken = broken
        self._tick_seconds = tick_seconds
        self._busy: dict[str, int] = {}

    async def job_failed(self, job_id: str, exc: Exception) -> None:
        """A job's step raised: a fault of the job (its trigger raised, its row refused
        the statement) marks it broken and retries it after the BROKEN_JOB backoff; a
        row held elsewhere is tried again soon (row_busy); a passing outage retries it
        a tick later. Its other jobs are never held up."""
        if is_busy_row(exc):
            self.row_busy(job_id, exc)
            return
        if await blames_job(self._store.engine, exc):
            await self._broken.mark(job_id, format_error(exc))
            self._rows.retry_in(job_id, BROKEN_JOB.delay(1))
            return
        logger.warning(
            "scheduler: claim of %s failed; retrying",
            job_id,
            exc_info=exc,
            extra={"action": "scheduler.claim_failed", "job_id": job_id},
        )
        self._rows.retry_in(job_id, self._tick_seconds)

    def row_busy(self, job_id: str, exc: Exception) -> None:
        """The job's claim met its row held by another transaction: try again on the
        retry backoff, never more than a tick apart, so that a row held for a moment (an
        outcome or an operator's write) costs its slot a moment, and one held for long
        is claimed within a tick of its release. Logged once until it is claimed."""
        tries = self._busy.get(job_id, 0)
        self._busy[job_id] = tries + 1
        retry = min(self._tick_seconds, BUSY_ROW.delay(tries + 1))
        if not tries:
            # A statement cut off on the row says why in the driver's words.
            reason = exc if isinstance(exc, JobRowBusyError) else getattr(exc, "orig", exc)
            logger.warning(
                "job.busy: job %s is due and its row is busy (%s); its other jobs fire, "
                "and it is tried again at least every %s s (pid=%s)",
                job_id,
                reason,
                self._tick_seconds,
                os.getpid(),
                extra={"action": "job.busy", "job_id": job_id, "pid": os.getpid()},
            )
        self._rows.retry_in(job_id, retry)

    def row_claimed(self, job_id: str) -> None:
        """The job's claim got its row: a busy spell of it is over."""
        if self._busy.pop(job_id, None) is not None:
            logger.info(
                "job.row_free: job %s was claimed once its row was free (pid=%s)",
                job_id,
                os.getpid(),
                extra={"action": "job.row_free", "job_id": job_id, "pid": os.getpid()},
            )

    def unmatched(self, job_id: str) -> None:
        """The job's claim matched nothing (another process took it, it was paused, or
        the key is gone): a busy spell of it ends without a word."""
        self._busy.pop(job_id, None)
