"""The one loop driver: every loop of the engine that acts, then waits, is a *step* that
returns its next delay, run by ``run_loop``.

A step does one pass (a tick, a renewal round, a wake of the job timer, a copy of a
service, a per-worker slot) and answers how long to wait before the next: seconds on
the loop's Clock, None for "until a wake", or ``Stop(value)`` to end the loop with
``value``. The wait ends early when one of the loop's ``wakes`` comes (a NOTIFY, a
changed timetable, a role change, a stop). A step that fails answers its backoff's
delay itself (every delay of every retry is a ``Backoff`` of retry.py, read there): so
how a loop waits and ends is read here once, what it does and how it retries in its
step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from .clock import Clock
from .waits import first

__all__ = ["Stop", "run_loop"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class Stop(Generic[_T]):
    """What a step returns to end its loop: run_loop returns ``value``."""

    value: _T


async def run_loop(
    step: Callable[[], Awaitable[float | Stop[_T] | None]],
    clock: Clock,
    *,
    first_delay: float = 0.0,
    wakes: Sequence[Callable[[], Awaitable[object]]] = (),
) -> _T:
    """Run ``step`` after ``first_delay`` seconds, then again after each delay it
    returns (none: at once, without a wait; None: at the next wake), until it returns
    Stop(value); return that value. A wait (the first one too) ends early when any of
    ``wakes`` (each a coroutine function, such as ``event.wait``) completes; the step
    then decides what the wake means (and clears an event it was woken by). What a
    step raises ends the loop, as a cancel does."""
    delay: float | None = first_delay
    while True:
        await _wait(clock, delay, wakes)
        answer = await step()
        if isinstance(answer, Stop):
            return answer.value
        delay = answer


async def _wait(
    clock: Clock, delay: float | None, wakes: Sequence[Callable[[], Awaitable[object]]]
) -> None:
    if delay is None:
        assert wakes, "a loop that waits for a wake needs one"
        await first(*(wake() for wake in wakes))
        return
    # No delay, no wait (not even a yield): the step asked to go again at once.
    if delay <= 0:
        return
    if not wakes:
        await clock.sleep(delay)
        return
    await first(clock.sleep(delay), *(wake() for wake in wakes))
