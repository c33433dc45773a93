"""What a claim is asked for and what it answers: one job's slot claim (SlotClaim) and
the run row it got (ClaimedSlot)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

__all__ = ["ClaimedSlot", "SlotClaim"]


@dataclass(frozen=True)
class ClaimedSlot:
    """A slot claim that matched: its run row, and 'running', 'missed',
    'skipped_overlap' (a run refused because another body holds the running lease) or
    'already_recorded' (the slot has its run already: the job moved on, nothing runs).
    ``term``: the leadership term the claim saw (0 before any leader was recorded).
    ``next_slot``: the job's next slot as the claim left it (a request leaves it)."""

    run_id: int
    status: str
    term: int
    next_slot: datetime
    error: str | None = None


@dataclass(frozen=True)
class SlotClaim:
    """One job's claim in a JobStore.claim_many(): its slot ``due`` (next_run_at), or
    with ``manual`` its run-now request made at ``due`` (run_requested_at).

    ``run_slot``: the slot of the run row (a late slot coalesces into the latest; a
    request's is the request time). ``next_slot``: where a slot claim moves next_run_at
    (None for a request, which leaves it). ``status``: 'running' for a run, which takes
    the running lease for ``lease_seconds``; 'missed' or 'skipped_overlap' for a slot
    claimed but not run. ``missed_before`` (slot, note) adds a 'missed' row for the
    slots an outage passed over before this one. ``jitter`` (seconds) is recorded
    apart: lateness counts from ``run_slot`` + ``jitter``.
    """

    job_id: str
    due: datetime
    run_slot: datetime
    next_slot: datetime | None
    status: str
    lease_seconds: float | None = None
    error: str | None = None
    missed_before: tuple[datetime, str] | None = None
    jitter: float = 0.0

    @classmethod
    def request(
        cls,
        job_id: str,
        requested_at: datetime,
        *,
        status: str,
        lease_seconds: float | None = None,
        error: str | None = None,
    ) -> SlotClaim:
        """The claim of the run-now request made at ``requested_at``."""
        return cls(job_id, requested_at, requested_at, None, status, lease_seconds, error)

    @property
    def manual(self) -> bool:
        """True for a run-now request."""
        return self.next_slot is None

    @property
    def runs(self) -> bool:
        """True when the claim starts a run (it asks for the running lease)."""
        return self.status == "running"
