"""The leader's copy of its job rows, and when it next acts on each job.

One LeaderRows per leadership, made from what its registration read and wrote. It
alone changes the copy and the timetable: the job timer's wake sets a row it claimed
and plans the job's next step; the tick's reload brings in the rows others changed
(a pause, a resume, a run now). A row found changed while its job's claim is under
way is read again once that claim is in (``claimed`` / ``changed_while_claimed``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from .clock import Clock
from .registry import JobSpec
from .store import JobRow, JobStore
from .timetable import Timetable

__all__ = ["LeaderRows", "fire_time"]

logger = logging.getLogger("app.scheduler")


class LeaderRows:
    """The rows of one leadership's jobs as last read or written, the horizon of the
    next look for rows changed by others, and the timetable of the job timer."""

    def __init__(
        self,
        rows: dict[str, JobRow],
        horizon: str,
        *,
        specs: Mapping[str, JobSpec],
        clock: Clock,
        claim_ahead: timedelta,
        tick_seconds: float,
    ) -> None:
        self._rows = rows
        # Where the tick's next look for rows changed by others starts (store.changed_rows).
        self._horizon = horizon
        self._specs = specs
        self._clock = clock
        self._claim_ahead = claim_ahead
        self._tick_seconds = tick_seconds
        # When this leadership next acts on each leader job (one timer for them all).
        self.timetable = Timetable()
        # Jobs whose row a read after their claim could not read again: the horizon may
        # have moved past what changed them, so the next tick reads them by id.
        self._unread: set[str] = set()
        # Jobs whose claim is under way, and those of them whose row the tick's reload
        # found changed meanwhile (read again once the claim is in).
        self._claiming: set[str] = set()
        self._changed_while_claiming: set[str] = set()

    def get(self, job_id: str) -> JobRow | None:
        """The job's row as last read or written; None when it has none (unregistered)."""
        return self._rows.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._rows

    def put(self, job_id: str, row: JobRow) -> None:
        """Take ``row`` as the job's row (registered late, or moved by its claim)."""
        self._rows[job_id] = row

    def plan_all(self, job_ids: Iterable[str]) -> None:
        """Plan every job's next step from its row, in one build of the timetable."""
        self.timetable.plan_all({job_id: self.next_step(job_id) for job_id in job_ids})

    def plan(self, job_id: str) -> None:
        """Plan the job's next step from its row (see next_step)."""
        self.timetable.plan(job_id, self.next_step(job_id))

    def plan_at(self, job_id: str, at: datetime) -> None:
        """Act on the job at ``at``, whatever its row says."""
        self.timetable.plan(job_id, at)

    def retry_in(self, job_id: str, seconds: float) -> None:
        """Act on the job again ``seconds`` from now."""
        self.timetable.plan(job_id, self._clock.now() + timedelta(seconds=seconds))

    def next_step(self, job_id: str) -> datetime | None:
        """When to act on the job, from its row: at once to register it if it has none,
        never while paused or while a newer registration made it per-worker (a reload
        plans it again), at once for its run-now request, else the claim lead before its
        next slot plus the slot's jitter."""
        row = self._rows.get(job_id)
        if row is not None and not row.leader_only:
            return None
        if row is None or row.run_requested_at is not None:
            return None if row is not None and row.paused else self._clock.now()
        if row.paused:
            return None
        fire_at = fire_time(self._specs[job_id], row.next_run_at)
        return None if fire_at is None else fire_at - self._claim_ahead

    def claiming(self, job_ids: set[str]) -> None:
        """The claim of ``job_ids`` begins: a row of theirs the reload finds changed
        meanwhile is kept for changed_while_claimed()."""
        self._claiming |= job_ids

    def claimed(self, job_ids: set[str]) -> None:
        """The claim of ``job_ids`` has its answer: a change found from now on is planned
        at once."""
        self._claiming -= job_ids

    def changed_while_claimed(self, job_ids: set[str]) -> list[str]:
        """Those of ``job_ids`` whose row the reload found changed during their claim;
        forgotten here, to be read again by the caller."""
        changed = [job_id for job_id in self._changed_while_claiming if job_id in job_ids]
        self._changed_while_claiming -= job_ids
        return changed

    async def reload(self, store: JobStore) -> list[str]:
        """Bring in the rows others changed since the last reload (pause, resume, run
        now), reading the rows that a read after a claim could not read again by id
        (what changed them may lie behind the horizon already), and plan each changed
        job again (or read it again once its claim under way is in). Returns the ids of
        the changed jobs that are paused now. Raises what the store raises, the copy
        then as it was."""
        unread = set(self._unread)
        rows = await store.load(unread) if unread else {}
        changed = await store.changed_rows(self._horizon)
        self._unread -= unread
        paused: list[str] = []
        for job_id, row in (rows | changed.rows).items():
            if job_id in self._rows and self._rows[job_id] != row:
                self._rows[job_id] = row
                if job_id in self._claiming:
                    self._changed_while_claiming.add(job_id)
                else:
                    self.plan(job_id)
                if row.paused:
                    paused.append(job_id)
        self._horizon = changed.horizon
        return paused

    async def read_again(
        self, store: JobStore, unmatched: dict[str, JobRow], changed: list[str]
    ) -> None:
        """Read again the rows of jobs whose claim matched nothing (each given with the
        row it was claimed from) and of jobs whose row the reload found changed while
        they were claimed, and plan them. A row unchanged since its claim is looked at
        again a tick later, or as soon as a reload finds it changed. When the read
        fails, each job keeps the row it has and the next tick reads its row again: the
        tick that found it changed has moved its horizon past the change already."""
        if not unmatched and not changed:
            return
        try:
            fresh = await store.load([*unmatched, *changed])
        except Exception:
            logger.warning(
                "scheduler: could not read the rows of jobs %s again; the next tick reads them",
                ", ".join(sorted({*unmatched, *changed})),
                exc_info=True,
            )
            self._unread.update(unmatched, changed)
            fresh = {}
        for job_id, before in unmatched.items():
            self._rows[job_id] = fresh.get(job_id, before)
            if self._rows[job_id] == before:
                self.retry_in(job_id, self._tick_seconds)
            else:
                self.plan(job_id)
        for job_id in changed:
            if job_id not in unmatched:
                self._rows[job_id] = fresh.get(job_id, self._rows[job_id])
                self.plan(job_id)


def fire_time(spec: JobSpec, slot: datetime) -> datetime | None:
    """When the job's slot fires: the slot plus its jitter. None when that is past the
    last moment a datetime holds (a next run an operator set to 'infinity'): such a
    slot never comes, and nothing else may stop for it."""
    try:
        return slot + timedelta(seconds=spec.jitter_delay(slot))
    except OverflowError:
        return None
