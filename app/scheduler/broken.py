"""The one book of this process's broken jobs.

A job is broken when its step failed by its own fault while the database answers
(faults.blames_job): its trigger raised, its row refused the statement. It is logged
once as ``job.broken`` (job id, pid), recorded in scheduler_broken_jobs (the admin job
list, the page and /health/scheduler show it), tried again after the BROKEN_JOB
backoff, and forgotten (``job.repaired``) at its next success. Every other job keeps
firing meanwhile. The leader's jobs and this worker's per-worker jobs share the book.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from .clock import Clock
from .retry import BROKEN_JOB
from .store import JobStore

__all__ = ["BrokenJobs"]

logger = logging.getLogger("app.scheduler")


class BrokenJobs:
    """The jobs this process found broken, and their records in the database."""

    def __init__(self, store: JobStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._ids: set[str] = set()

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._ids

    @property
    def ids(self) -> frozenset[str]:
        """The jobs this process holds broken now."""
        return frozenset(self._ids)

    async def mark(self, job_id: str, error: str) -> None:
        """Record ``job_id`` as broken with ``error`` (a formatted traceback); log it
        once until it is repaired. Never raises: a record that fails is logged, and the
        next failure of the job records it again."""
        if job_id not in self._ids:
            self._ids.add(job_id)
            logger.error(
                "job.broken: job %s cannot be handled (%s); its other jobs keep firing and "
                "it is retried every %s s (pid=%s)",
                job_id,
                # The last line of a traceback names the exception; the table keeps it all.
                error.strip().splitlines()[-1] if error.strip() else error,
                BROKEN_JOB.delay(1),
                os.getpid(),
                extra={"action": "job.broken", "job_id": job_id, "pid": os.getpid()},
            )
        try:
            await self._store.mark_broken(job_id, error, self._clock.now())
        except Exception:
            logger.warning("scheduler: could not record job %s as broken", job_id, exc_info=True)

    async def repaired(self, job_ids: Iterable[str]) -> None:
        """Forget the broken marks of ``job_ids``, whose registration or claim
        succeeded, in the database too (a mark another process of this schedule left is
        cleared as well). Never raises: a mark left behind is cleared by the next
        success."""
        job_ids = list(job_ids)
        try:
            await self._store.clear_broken(job_ids)
        except Exception:
            logger.warning("scheduler: could not clear the broken marks", exc_info=True)
            return
        for job_id in self._ids.intersection(job_ids):
            self._ids.discard(job_id)
            logger.info(
                "job.repaired: job %s is handled again (pid=%s)",
                job_id,
                os.getpid(),
                extra={"action": "job.repaired", "job_id": job_id, "pid": os.getpid()},
            )
