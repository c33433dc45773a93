"""The start window: work claimed under a lease starts only while the lease surely holds.

A claim takes a lease on the lease clock (the database server's); the work it claimed
may begin much later: slots free up slowly, the event loop is busy, the process froze,
its clock jumped. Work begun after its lease ran out may run beside another process's
claim of the same thing. So the claimant reads its monotonic clock (Clock.monotonic)
just *before* the claim is sent, and starts the work only within a window measured
from that moment. Elapsed time since before the claim is never less than the time
elapsed on the database since the lease was stamped, so a window no longer than the
lease closes no later than the lease runs out there; and an elapsed time is changed
neither by an offset between hosts' clocks nor by a step of this host's wall clock.

Used by the scheduler (a claimed job body: bodies.py, window from the LeaseKeeper)
and the outbox (a claimed row's delivery: app/outbox/drain.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .clock import Clock

__all__ = ["StartWindow"]


@dataclass(frozen=True)
class StartWindow:
    """Work claimed at ``opened_at`` (Clock.monotonic, read just before the claim) may
    start within ``seconds`` of it, and never after."""

    opened_at: float
    seconds: float

    @property
    def closes_at(self) -> float:
        """The monotonic moment past which the work may not start."""
        return self.opened_at + self.seconds

    def closed(self, clock: Clock) -> bool:
        """True once ``clock``'s monotonic time has passed the window: do not start."""
        return clock.monotonic() > self.closes_at
