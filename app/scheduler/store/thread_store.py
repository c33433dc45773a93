"""The store's lease and outcome writes on the sync engine, for a thread: the same
statement sequences as the event loop's (renew_steps, finish_steps, service_release)."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from ..clock import Clock
from ..keys import DEFAULT_SCHEDULE
from .base import lease_reading, read_committed, run_steps_sync
from .leases import HeldLease, renew_steps, service_release
from .runs import Outcome, finish_steps

__all__ = ["ThreadStore"]


class ThreadStore:
    """JobStore's lease and outcome writes on the sync engine, callable from any thread:
    for a body's thread and its lease keeper once the event loop is gone."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        schedule: str = DEFAULT_SCHEDULE,
        *,
        lease_clock: Clock | None = None,
    ) -> None:
        self.sessions = sessions
        self.schedule = schedule
        self.lease_clock = lease_clock

    def renew_lease(self, lease: HeldLease, lease_seconds: float) -> bool:
        """JobStore.renew_leases of one lease: False when it is no longer held."""
        steps = renew_steps(self.schedule, [lease], lease_seconds, lease_reading(self.lease_clock))
        with self.sessions.begin() as session:
            return lease.run_id in run_steps_sync(read_committed(session), steps)

    def release_service_lease(self, lease: HeldLease) -> None:
        """JobStore.release_service_lease, from a thread."""
        with self.sessions.begin() as session:
            read_committed(session).execute(*service_release(self.schedule, lease))

    def finish(self, outcome: Outcome) -> None:
        """JobStore.finish_many of one body that ended: record it, clear the lease."""
        steps = finish_steps(self.schedule, [outcome], lease_reading(self.lease_clock))
        with self.sessions.begin() as session:
            run_steps_sync(read_committed(session), steps)
