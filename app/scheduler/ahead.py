"""The timing of claims prepared ahead of their slot: when a prepared claim commits (its
margin, learned from what the last ones cost), and the collector held off while the
bodies of a crowd start."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from datetime import timedelta

__all__ = ["CommitCost", "collector_held_off"]


class CommitCost:
    """How long a prepared claim takes from its commit to its bodies started, per job,
    as measured on this process (the lead of the commit over the slot)."""

    # Before the first measure: twice what a 2-core machine measured.
    _FIRST_GUESS = 1e-4

    def __init__(self) -> None:
        self._per_job = self._FIRST_GUESS

    def margin(self, jobs: int, most: timedelta) -> timedelta:
        """How long before the slot to commit the claim of ``jobs`` jobs: half again
        what they took last, and a couple of milliseconds for the commit itself."""
        return min(most, timedelta(seconds=0.002 + 1.5 * self._per_job * jobs))

    def learn(self, jobs: int, began: float | None) -> None:
        """A claim that began committing at ``began`` (time.perf_counter; None: it never
        did) is in and its ``jobs`` bodies are started: average the cost per job with
        the earlier ones (none started: the claim taught nothing)."""
        if began is None or not jobs:
            return
        self._per_job = (self._per_job + (time.perf_counter() - began) / jobs) / 2


@contextlib.contextmanager
def collector_held_off() -> Iterator[None]:
    """Keep the cyclic garbage collector from running while a wake starts its bodies:
    a full collection in the middle (90 ms with 100,000 objects on the heap, measured)
    would make every later body of a crowd that late. It runs at its next threshold
    after; a collector the application turned off stays off."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
