"""A leader's claim of due slots and run-now requests: what each claim writes (its
plan: coalesced late slots, misfire grace, an overlap with a body running here) and
the Claim each answer gives, before any body runs."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from .clock import Clock
from .errors import JobRowBusyError
from .registry import JobSpec
from .store import ClaimedSlot, JobStore, PreparedCommit, SlotClaim
from .triggers import COUNTED_SLOTS, Trigger

__all__ = ["Claim", "Claimer", "Due"]

logger = logging.getLogger("app.scheduler")

_BUSY_HERE = "the previous run was still going in this process"
# Claim outcomes that start no body.
_NOT_RUN = ("already_recorded", "skipped_overlap")


@dataclass(frozen=True)
class Due:
    """What a leader claims for a job: its slot ``due`` (the job's next_run_at), or
    with ``manual`` its run-now request made at ``due``."""

    spec: JobSpec
    due: datetime
    manual: bool = False


@dataclass(frozen=True)
class _Planned:
    """A claim about to be made: the job and what its claim writes."""

    spec: JobSpec
    item: SlotClaim


@dataclass(frozen=True)
class Claim:
    """A slot this process won: its run row, the slot run, and the job's next slot.

    ``leased``: the run holds a running lease: the job row's for a leader run; its own
    run row's for a per-worker run (``replica``), which many workers run at once.
    ``jitter``: seconds the fire waited after the slot by design; lateness counts from
    the slot plus the jitter.
    ``term``: the leadership term the claim saw, which fences the body's commits; None
    for a replica run, which no leadership fences.
    ``manual``: the run-now request was claimed, not a slot; the slot run is the
    request time and the job's next slot is where the claim found it.
    ``leased_at``: the moment its running lease was taken as of, on this process's
    monotonic clock (Clock.monotonic).
    """

    run_id: int
    slot: datetime
    next_slot: datetime
    runs: bool
    leased: bool = False
    jitter: float = 0.0
    term: int | None = None
    manual: bool = False
    replica: bool = False
    leased_at: float | None = None


class Claimer:
    """Claims slots for one process: plans each claim, has the store make them in one
    commit, and turns each answer into a Claim. ``busy_here(job_id)`` says whether a
    body of the job runs in this process; ``observe`` counts a run that starts no body
    (missed, skipped_overlap)."""

    def __init__(
        self,
        store: JobStore,
        *,
        clock: Clock,
        zone: ZoneInfo,
        lease_seconds: float,
        busy_here: Callable[[str], bool],
        renewing: Callable[[], frozenset[int]],
        observe: Callable[[JobSpec, str, float, timedelta], None],
    ) -> None:
        self._store = store
        self._renewing = renewing
        self._clock = clock
        self._zone = zone
        self._lease_seconds = lease_seconds
        self._busy_here = busy_here
        self._observe = observe

    async def claim_many(
        self, dues: Sequence[Due], fence_pid: int | None, prepared: PreparedCommit | None = None
    ) -> list[Claim | Exception | None]:
        """Claim every slot and run-now request in ``dues`` (one per job) in one commit
        of a few statements (JobStore.claim_many); each claim commits before any body
        runs. Returns, in order, each one's Claim, or None where the claim matched
        nothing (another process took it, the job is paused, or this process no longer
        holds the lock), or the exception its job's trigger raised or the
        JobRowBusyError of a row another transaction holds (that job was not claimed;
        the others were).

        A slot: late slots coalesce into one run of the latest slot; with
        ``misfire_grace`` a slot later than the grace is claimed as ``missed`` instead of
        run; while a body of the job runs in this process it is claimed as
        ``skipped_overlap``. Jobs that share a trigger and a due slot share its slot
        math, computed once.

        A run-now request: one more run, whose slot is the request time, that fires at
        once (no jitter, no misfire grace, nothing coalesced) and leaves the job's next
        slot alone; like a slot, it is recorded skipped_overlap while a body of the job
        runs here or holds the running lease elsewhere.

        ``prepared``: the claim is made now and committed at its ``starts_at``
        (JobStore.claim_many), planned as of that instant.
        """
        # Read right before the claim: the running lease starts at this instant.
        now = self._clock.now() if prepared is None else prepared.start()
        slots: dict[tuple[Trigger, datetime], tuple[datetime, int, datetime]] = {}
        plans: list[_Planned | Exception] = []
        for due in dues:
            try:
                plans.append(self._plan(due, now, slots))
            except Exception as exc:
                plans.append(exc)
        items = [plan.item for plan in plans if isinstance(plan, _Planned)]
        claimed = iter(
            await self._store.claim_many(
                items,
                now=now,
                fence_pid=fence_pid,
                prepared=prepared,
                renewing=self._renewing(),
            )
        )
        return [
            plan if isinstance(plan, Exception) else self._claimed(plan, next(claimed), now)
            for plan in plans
        ]

    def _plan(
        self,
        due: Due,
        now: datetime,
        slots: dict[tuple[Trigger, datetime], tuple[datetime, int, datetime]],
    ) -> _Planned:
        """What claiming ``due`` at ``now`` writes; raises what the job's trigger raises."""
        spec = due.spec
        busy_here = self._busy_here(spec.id)
        if due.manual:
            item = SlotClaim.request(
                spec.id,
                due.due,
                status="skipped_overlap" if busy_here else "running",
                lease_seconds=None if busy_here else self._lease_seconds,
                error=_BUSY_HERE if busy_here else None,
            )
            return _Planned(spec, item)
        key = (spec.trigger, due.due)
        if key not in slots:
            latest, passed = spec.trigger.latest_slot(due.due, now, self._zone)
            slots[key] = (latest, passed, spec.trigger.next_after(latest, self._zone))
        latest, passed, next_slot = slots[key]
        if busy_here:
            item = SlotClaim(
                spec.id, due.due, latest, next_slot, "skipped_overlap", error=_BUSY_HERE
            )
            return _Planned(spec, item)
        grace = spec.misfire_grace
        jitter = spec.jitter_delay(latest)
        # Lateness counts from when the schedule meant to fire: the slot plus its jitter.
        missed = grace is not None and (now - latest).total_seconds() - jitter > grace
        error = missed_before = None
        # Past COUNTED_SLOTS the trigger stopped counting: the note says "at least".
        at_least = "at least " if passed >= COUNTED_SLOTS else ""
        if missed:
            error = f"{at_least}{passed + 1} slot(s) later than misfire_grace ({grace:g} s) skipped"
        elif grace is not None and passed:
            missed_before = (
                due.due,
                f"{at_least}{passed} slot(s) later than misfire_grace ({grace:g} s)",
            )
        item = SlotClaim(
            spec.id,
            due.due,
            latest,
            next_slot,
            "missed" if missed else "running",
            lease_seconds=None if missed else self._lease_seconds,
            error=error,
            missed_before=missed_before,
            jitter=jitter,
        )
        return _Planned(spec, item)

    def _claimed(
        self, plan: _Planned, claimed: ClaimedSlot | JobRowBusyError | None, now: datetime
    ) -> Claim | JobRowBusyError | None:
        """The Claim of a planned claim the store answered; logs and counts what starts
        no body."""
        if claimed is None or isinstance(claimed, JobRowBusyError):
            return claimed
        spec, item = plan.spec, plan.item
        next_slot = claimed.next_slot if item.next_slot is None else item.next_slot
        if claimed.status in _NOT_RUN:
            return self._not_run(spec, claimed, item.run_slot, next_slot, now, manual=item.manual)
        if item.status == "missed":
            logger.warning(
                'Missed job "%s" (id=%s, slot=%s, pid=%s)',
                spec.name,
                spec.id,
                item.run_slot.isoformat(),
                self._store.pid,
                extra={"action": "job.missed", "job_id": spec.id, "pid": self._store.pid},
            )
            self._observe(spec, "missed", 0.0, now - item.run_slot)
        runs = item.status == "running"
        return Claim(
            claimed.run_id,
            item.run_slot,
            next_slot,
            runs=runs,
            leased=runs,
            jitter=item.jitter,
            term=claimed.term,
            manual=item.manual,
            # ``now`` (a prepared claim's start may lie ahead) on the monotonic clock.
            leased_at=self._clock.monotonic() + (now - self._clock.now()).total_seconds(),
        )

    def _not_run(
        self,
        spec: JobSpec,
        claimed: ClaimedSlot,
        slot: datetime,
        next_slot: datetime,
        now: datetime,
        *,
        manual: bool = False,
    ) -> Claim:
        """Log and count a claim that starts no body: its slot already has a run, or
        another body of the job holds the running lease."""
        if claimed.status == "already_recorded":
            logger.warning(
                'Job "%s" came back to a slot it has run: %s; moving on (id=%s, pid=%s)',
                spec.name,
                claimed.error,
                spec.id,
                self._store.pid,
                extra={"action": "job.slot_already_run", "job_id": spec.id, "pid": self._store.pid},
            )
        else:
            logger.warning(
                'Skipped job "%s": %s (id=%s, slot=%s, pid=%s)',
                spec.name,
                claimed.error,
                spec.id,
                slot.isoformat(),
                self._store.pid,
                extra={"action": "job.skipped_overlap", "job_id": spec.id, "pid": self._store.pid},
            )
            self._observe(spec, "skipped_overlap", 0.0, now - slot)
        return Claim(claimed.run_id, slot, next_slot, runs=False, manual=manual)
