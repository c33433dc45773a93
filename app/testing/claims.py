"""One slot's or one request's claim, as a test makes it: the leader claims every slot of
a wake together (Runner.claim_many, JobStore.claim_many); a test or run_job claims one."""

from __future__ import annotations

from datetime import datetime

from app.scheduler.errors import JobRowBusyError
from app.scheduler.registry import JobSpec
from app.scheduler.runner import Claim, Due, Runner
from app.scheduler.store import ClaimedSlot, JobStore, SlotClaim

__all__ = ["claim_leader", "claim_request", "claim_slot"]


async def claim_leader(
    runner: Runner, spec: JobSpec, due: datetime, fence_pid: int | None
) -> Claim | None:
    """Claim slot ``due`` of a leader-only job: runner.claim_many() of that one slot.
    Raises what the job's trigger raises, or the JobRowBusyError of a held row."""
    return _one(await runner.claim_many([Due(spec, due)], fence_pid))


async def claim_request(
    runner: Runner, spec: JobSpec, requested_at: datetime, fence_pid: int | None
) -> Claim | None:
    """Claim the run-now request made at ``requested_at`` of a leader-only job:
    runner.claim_many() of that one request."""
    return _one(await runner.claim_many([Due(spec, requested_at, manual=True)], fence_pid))


async def claim_slot(
    store: JobStore,
    spec: JobSpec,
    *,
    due: datetime,
    next_slot: datetime,
    run_slot: datetime,
    now: datetime,
    status: str,
    fence_pid: int | None,
    lease_seconds: float | None = None,
) -> ClaimedSlot | None:
    """Claim slot ``due`` and record its run row, in one commit: store.claim_many() of
    one slot (see SlotClaim for the arguments), below the runner. Returns the run row
    and the status it got, or None when the claim matched nothing: another process
    took the slot, the job is paused, or (fenced) this process no longer holds the
    leader key. Raises JobRowBusyError when another transaction holds the job's row."""
    item = SlotClaim(
        spec.id,
        due=due,
        run_slot=run_slot,
        next_slot=next_slot,
        status=status,
        lease_seconds=lease_seconds,
    )
    (claimed,) = await store.claim_many([item], now=now, fence_pid=fence_pid)
    if isinstance(claimed, JobRowBusyError):
        raise claimed
    return claimed


def _one(claims: list[Claim | Exception | None]) -> Claim | None:
    """The only claim of a one-job claim_many(); raises its exception."""
    (claim,) = claims
    if isinstance(claim, Exception):
        raise claim
    return claim
