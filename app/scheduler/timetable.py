"""When the leader next acts on each of its jobs: the only planner of the job timer."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from datetime import datetime

__all__ = ["Timetable"]


class Timetable:
    """When the leader next acts on each job: a heap keyed by that moment, with one live
    entry per job. Planning a job again leaves its older entry in the heap, skipped
    when it surfaces; the heap is rebuilt once such entries outnumber the live ones."""

    def __init__(self) -> None:
        self._heap: list[tuple[datetime, int, str]] = []
        self._at: dict[str, datetime] = {}
        self._order = itertools.count()
        # Set when a job is planned sooner than the timer's wait.
        self.changed = asyncio.Event()

    def planned(self, job_id: str) -> datetime | None:
        """When the job is planned, or None."""
        return self._at.get(job_id)

    def plan(self, job_id: str, at: datetime | None) -> None:
        """Act on the job at ``at`` instead of when it was planned (None: not at all)."""
        if at is None:
            self._at.pop(job_id, None)
            return
        soonest = self.soonest()
        self._at[job_id] = at
        heapq.heappush(self._heap, (at, next(self._order), job_id))
        if soonest is None or at < soonest:
            self.changed.set()
        if len(self._heap) > 2 * len(self._at) + 64:
            self._heap = [(at, next(self._order), job) for job, at in self._at.items()]
            heapq.heapify(self._heap)

    def plan_all(self, moments: dict[str, datetime | None]) -> None:
        """plan() every job given, in one build of the heap: a leadership plans all of
        its jobs at once, and 10,000 pushes that each look at the soonest add up."""
        for job_id, at in moments.items():
            if at is None:
                self._at.pop(job_id, None)
            else:
                self._at[job_id] = at
        self._heap = [(at, next(self._order), job) for job, at in self._at.items()]
        heapq.heapify(self._heap)
        self.changed.set()

    def soonest(self) -> datetime | None:
        """The soonest moment any job is planned at."""
        self._drop_stale()
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: datetime) -> list[str]:
        """Unplan and return every job planned at or before ``now``, soonest first."""
        due: list[str] = []
        while (soonest := self.soonest()) is not None and soonest <= now:
            _, _, job_id = heapq.heappop(self._heap)
            del self._at[job_id]
            due.append(job_id)
        return due

    def _drop_stale(self) -> None:
        heap = self._heap
        while heap and self._at.get(heap[0][2]) != heap[0][0]:
            heapq.heappop(heap)
