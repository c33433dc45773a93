"""What a job body receives: its slot, the clock, a logger, database sessions, and the
fence of its leadership term."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .clock import Clock
from .errors import LeadershipLostError, SchedulerError
from .keys import DEFAULT_SCHEDULE
from .registry import JobSpec

__all__ = ["JobContext", "ServiceContext", "job_log", "service_log"]

# FOR KEY SHARE: a promotion's term bump, which locks the row FOR UPDATE first, waits
# until this transaction ends (a leader tick at most: then it ends this transaction);
# the leader's heartbeat, a plain UPDATE, does not (a tick that waited would stop
# reloading and checking the lock for as long). No row yet (no leader was ever
# recorded) reads as term 0, as the claim does.
_TERM_FOR_KEY_SHARE = text(
    "SELECT term FROM scheduler_leadership WHERE schedule = :schedule FOR KEY SHARE"
)


@dataclass
class JobContext:
    """The context of one fire of one job.

    ``scheduled_at`` is the slot's due time (aware, UTC), not the time the body
    started; ``zone`` is the scheduler's default zone (the TIMEZONE setting). Sessions
    are opened on first use: ``session`` in async jobs, ``sync_session`` in thread jobs.
    The runner commits the session when the body returns normally and rolls it back
    when the body raises, times out or is cancelled; then it closes it. A body may
    also commit itself (per row, say); what it committed stays committed.

    A body can outlive its leader's lock (a thread cannot be cancelled; an async body
    runs until its leader notices the loss), so a commit that moves money is fenced:
    ``await ctx.fence(session)`` (``ctx.fence_sync(session)`` in a thread job), inside
    the transaction it guards, best just before the commit. It raises
    LeadershipLostError, after rolling the transaction back, when another leadership
    began since this run was claimed (``term`` is the one the claim saw); otherwise
    the transaction holds the term until it ends, and the next promotion waits for it,
    a leader tick at most: then it ends the transaction (its connection is terminated).
    So a fenced commit lands before any newer leadership starts, or not at all. A
    per-worker job (``leader_only=False``) has no term: its fence raises
    SchedulerError.
    """

    job_id: str
    name: str
    scheduled_at: datetime
    clock: Clock
    log: logging.LoggerAdapter[logging.Logger]
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    term: int | None = None
    # The schedule whose leadership term fences this run (see app/scheduler/keys.py).
    schedule: str = DEFAULT_SCHEDULE
    _sessions: async_sessionmaker[AsyncSession] | None = field(default=None, repr=False)
    _sync_sessions: sessionmaker[Session] | None = field(default=None, repr=False)
    _session: AsyncSession | None = field(default=None, repr=False)
    _sync_session: Session | None = field(default=None, repr=False)

    @property
    def session(self) -> AsyncSession:
        """An AsyncSession for an async job. Raises SchedulerError in a thread job."""
        if self._sessions is None:
            raise SchedulerError(
                f'job "{self.job_id}" runs in a thread; use ctx.sync_session there'
            )
        if self._session is None:
            self._session = self._sessions()
        return self._session

    @property
    def sync_session(self) -> Session:
        """A sync Session for a thread job. Raises SchedulerError in an async job."""
        if self._sync_sessions is None:
            raise SchedulerError(
                f'job "{self.job_id}" runs on the event loop; use ctx.session there'
            )
        if self._sync_session is None:
            self._sync_session = self._sync_sessions()
        return self._sync_session

    async def fence(self, session: AsyncSession) -> None:
        """Fence ``session``'s transaction by this run's leadership term (see the class
        doc). Raises LeadershipLostError, with the transaction rolled back, when a newer
        leadership began; SchedulerError in a per-worker job."""
        run_term = self._term_to_fence()
        current = (
            await session.execute(_TERM_FOR_KEY_SHARE, {"schedule": self.schedule})
        ).scalar_one_or_none() or 0
        if current != run_term:
            await session.rollback()
            raise LeadershipLostError(self.job_id, run_term, current)

    def fence_sync(self, session: Session) -> None:
        """``fence`` for a thread job's sync ``session`` (call it in the job's thread)."""
        run_term = self._term_to_fence()
        current = (
            session.execute(_TERM_FOR_KEY_SHARE, {"schedule": self.schedule}).scalar_one_or_none()
            or 0
        )
        if current != run_term:
            session.rollback()
            raise LeadershipLostError(self.job_id, run_term, current)

    def _term_to_fence(self) -> int:
        if self.term is None:
            raise SchedulerError(
                f'job "{self.job_id}" runs on every worker (leader_only=False), so no '
                "leadership term fences it; drop the fence, or make the job leader_only"
            )
        return self.term

    async def commit(self) -> None:
        """Commit the async session if one was opened (the runner does, on success)."""
        if self._session is not None:
            await self._session.commit()

    async def aclose(self) -> None:
        """Close the async session if one was opened, rolling back what is uncommitted."""
        if self._session is not None:
            await self._session.close()

    def commit_sync(self) -> None:
        """Commit the sync session if one was opened (in the job's thread, on success)."""
        if self._sync_session is not None:
            self._sync_session.commit()

    def close_sync(self) -> None:
        """Close the sync session if one was opened, rolling back what is uncommitted
        (call in the job's thread)."""
        if self._sync_session is not None:
            self._sync_session.close()


@dataclass
class ServiceContext:
    """The context of a leader-only service: cancelled when this worker stops leading."""

    service_id: str
    name: str
    clock: Clock
    log: logging.LoggerAdapter[logging.Logger]
    sessions: async_sessionmaker[AsyncSession]


def job_log(spec: JobSpec, pid: int) -> logging.LoggerAdapter[logging.Logger]:
    """The logger a job's context logs through (``ctx.log``): ``regent.job.<id>``, a
    name of Regent's whatever package the job lives in, with the job id and the pid in
    every record."""
    return logging.LoggerAdapter(spec.logger, {"job_id": spec.id, "pid": pid})


def service_log(service_id: str, pid: int) -> logging.LoggerAdapter[logging.Logger]:
    """The logger a service's context logs through: ``regent.service.<id>``, with the
    service id (as ``job_id``) and the pid in every record."""
    return logging.LoggerAdapter(
        logging.getLogger(f"regent.service.{service_id}"), {"job_id": service_id, "pid": pid}
    )
