"""Where the scheduler and the outbox get time from. Only this module reads the real
clock.

Every "now" and every wait goes through a Clock, so that tests make "due" a fixture: a
FakeClock's sleepers wake when the test advances it, never by real time passing.

Every lease and every "is it due" is read on the *lease clock* instead: the database
server's, the one clock all processes share, since hosts' clocks disagree; or a test's
FakeClock, which the test shares between the processes it plays. In SQL
(``LEASE_NOW_SQL``): the scheduler's running leases and heartbeat, the outbox's row
leases, due times and retries, and what operators read and reset. In the process
(``ServerClock``): when a scheduler's timers find a slot due, and the time its jobs
are given.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Protocol

__all__ = [
    "LEASE_END_SQL",
    "LEASE_NOW_SQL",
    "Clock",
    "FakeClock",
    "ServerClock",
    "SystemClock",
    "lease_clock",
    "lease_now",
    "lease_now_sql",
]


def lease_now_sql(parameter: str) -> str:
    """The lease clock's now in a statement whose lease-now parameter (lease_now()
    gives its value) is ``parameter``: the database server's ``clock_timestamp()``
    when the parameter is NULL, as under the system clock. ``clock_timestamp()``, not
    ``now()``: a statement of a transaction held open for a while (a prepared claim)
    reads the time it runs at. It is volatile, so a comparison that an index should
    bound reads it through a scalar subquery, evaluated once (``x <= (SELECT ...)``)."""
    return f"COALESCE(CAST({parameter} AS timestamptz), clock_timestamp())"


LEASE_NOW_SQL = lease_now_sql(":lease_now")
"""lease_now_sql for SQLAlchemy's text(), whose parameter is ``:lease_now``."""

LEASE_END_SQL = (
    f"({LEASE_NOW_SQL} + make_interval(secs => CAST(:lease_seconds AS double precision)))"
)
"""The end of a lease of ``:lease_seconds`` taken now, on the lease clock."""


class Clock(Protocol):
    """A source of aware UTC datetimes and of waiting."""

    def now(self) -> datetime:
        """The current time, timezone-aware, in UTC."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never steps (an arbitrary origin): what every elapsed
        time (a wait, a window) is measured on, so that a wall clock stepped by NTP
        neither stretches nor shortens it."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class SystemClock:
    """The real clock: wall time from the OS, waiting through asyncio."""

    def now(self) -> datetime:
        """The current wall-clock time in UTC."""
        return datetime.now(UTC)

    def monotonic(self) -> float:
        """time.monotonic(): never steps with the wall clock."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """asyncio.sleep; a non-positive delay yields once."""
        await asyncio.sleep(max(0.0, seconds))


class FakeClock:
    """A clock that moves only when told to: ``advance()`` or ``set()``.

    ``sleep()`` parks the caller until the clock passes its deadline. ``sleepers``
    and ``wait_for_sleepers()`` let a test wait until the code under test is parked,
    instead of sleeping for real.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        if self._now.tzinfo is None:
            raise ValueError("FakeClock start must be timezone-aware")
        self._sleepers: list[tuple[datetime, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._parked = asyncio.Condition()

    def now(self) -> datetime:
        """The fake current time."""
        return self._now

    def monotonic(self) -> float:
        """The fake time in seconds: it moves only as the test moves the clock."""
        return self._now.timestamp()

    @property
    def sleepers(self) -> int:
        """How many sleep() calls are parked right now."""
        return sum(1 for _, _, future in self._sleepers if not future.done())

    async def sleep(self, seconds: float) -> None:
        """Park until the clock reaches now + ``seconds``; yield once if that is not ahead."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(
            self._sleepers, (self._now + timedelta(seconds=seconds), next(self._order), future)
        )
        await self._notify_parked()
        try:
            await future
        finally:
            self._sleepers = [entry for entry in self._sleepers if entry[2] is not future]
            heapq.heapify(self._sleepers)

    def advance(self, delta: float | timedelta) -> None:
        """Move the clock forward and wake every sleeper whose deadline has passed."""
        step = delta if isinstance(delta, timedelta) else timedelta(seconds=delta)
        if step < timedelta(0):
            raise ValueError("a clock does not go backwards; use set() to jump")
        self.set(self._now + step)

    def set(self, moment: datetime) -> None:
        """Jump to ``moment`` (aware) and wake every sleeper due by then."""
        if moment.tzinfo is None:
            raise ValueError("FakeClock.set needs a timezone-aware datetime")
        self._now = moment.astimezone(UTC)
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    async def wait_for_sleepers(self, count: int = 1, timeout: float = 10) -> None:
        """Return once at least ``count`` sleep() calls are parked on this clock."""
        async with asyncio.timeout(timeout), self._parked:
            await self._parked.wait_for(lambda: self.sleepers >= count)

    async def wait_for_a_sleeper_until(self, moment: datetime, timeout: float = 10) -> None:
        """Return once a sleep() whose deadline is exactly ``moment`` is parked on this
        clock: a test that knows when one loop wakes next (a tick ends at now + the
        tick) waits for that loop, where a count of sleepers can be made up by another
        loop's sleep (a running lease's renewal) while the one it means is still awake."""
        async with asyncio.timeout(timeout), self._parked:
            await self._parked.wait_for(
                lambda: any(
                    deadline == moment and not future.done()
                    for deadline, _, future in self._sleepers
                )
            )

    async def _notify_parked(self) -> None:
        async with self._parked:
            self._parked.notify_all()


MAX_ROUND_TRIP_SECONDS = 1.0
"""The longest round trip a ServerClock measures over: the offset is off by up to half."""


class ServerClock:
    """The database server's clock, read without a round trip: this host's clock plus
    the offset last measured against the server (``measure``).

    A scheduler on the system clock decides "is it due" on this, so a host whose clock
    runs ahead fires no slot early and one behind fires none late. The offset is off by
    at most half the round trip of the measurement it came from; a host clock that
    steps (NTP) is wrong by the step until the next measurement.
    """

    def __init__(self, host: Clock) -> None:
        self.host = host
        self._offset = timedelta(0)
        self._measured = False

    @property
    def measured(self) -> bool:
        """Whether a measurement was taken: until then the offset is 0, the host's own
        clock, which must not decide "is it due"."""
        return self._measured

    @property
    def offset(self) -> timedelta:
        """How far the server's clock is ahead of this host's (negative: behind)."""
        return self._offset

    def now(self) -> datetime:
        """The server's current time, as the last measurement lets this host tell it."""
        return self.host.now() + self._offset

    def monotonic(self) -> float:
        """The host's monotonic clock: an interval is the same on both."""
        return self.host.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on the host's clock: an interval is the same on both."""
        await self.host.sleep(seconds)

    async def measure(self, read_server_now: Callable[[], Awaitable[datetime]]) -> None:
        """Measure the offset with one reading of the server's clock by
        ``read_server_now`` (it raises what the database raises), taken as read halfway
        through the round trip. A reading whose round trip on the host's clock is
        negative or over ``MAX_ROUND_TRIP_SECONDS`` (the host's clock stepped meanwhile,
        or the database was slow to answer) leaves the offset as it was."""
        asked_at = self.host.now()
        server_now = await read_server_now()
        answered_at = self.host.now()
        round_trip = (answered_at - asked_at).total_seconds()
        if 0 <= round_trip <= MAX_ROUND_TRIP_SECONDS:
            self._offset = server_now - (asked_at + (answered_at - asked_at) / 2)
            self._measured = True


def lease_clock(clock: Clock) -> Clock | None:
    """The clock running leases are measured on for a process whose clock is ``clock``.

    None for the system clock: leases are then written and compared on the database
    server's clock, the one clock every process shares, since hosts' clocks disagree
    (a reaper whose clock ran ahead of the owner's by most of a lease took a live run
    for a dead one). Any other clock (a FakeClock, which a test shares between the
    processes it plays) measures the leases itself, so a test moves them with it.
    """
    return None if isinstance(clock, SystemClock | ServerClock) else clock


def lease_now(clock: Clock) -> datetime | None:
    """What a process whose clock is ``clock`` binds as the lease clock's now
    (``:lease_now`` of LEASE_NOW_SQL): None for the system clock, which leaves the
    database server to read its own clock in the statement; the fake clock's now
    otherwise (see lease_clock)."""
    measured = lease_clock(clock)
    return None if measured is None else measured.now()
