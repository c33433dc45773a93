"""What every part of the store shares: the store's binding to one schedule and one
process (StoreBase), how values travel as text arrays, and the one way a sequence of
statements runs, on the async engine or on a thread's sync session."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Connection, Executable
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Session

from ..clock import Clock
from ..keys import DEFAULT_SCHEDULE, LeaderKey

__all__ = [
    "Statement",
    "Steps",
    "StoreBase",
    "as_text",
    "flag",
    "iso",
    "lateness_ms",
    "lease_reading",
    "read_committed",
    "run_steps",
    "run_steps_sync",
]

_T = TypeVar("_T")

# One statement of a sequence and its parameters.
Statement = tuple[Executable, dict[str, object]]
# A sequence of statements that both engines run (run_steps, run_steps_sync): it yields
# each statement, is sent the rows it returned, and returns its answer. Written once,
# so a thread's write and the loop's are the same statements in the same order.
Steps = Generator[Statement, Sequence[Any], _T]


class StoreBase:
    """What every part of a JobStore is bound to: the app's engine (read committed),
    this process (``pid`` on ``host``), the schedule and its key, and the lease clock
    (see JobStore)."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        pid: int,
        host: str,
        lease_clock: Clock | None = None,
        schedule: str = DEFAULT_SCHEDULE,
    ) -> None:
        # Read committed whatever the database or role defaults to: under repeatable
        # read an outcome write that meets a concurrent update of the job row (a lease
        # renewal, a pause, another leader's claim) fails, and the outcome is lost.
        self.engine = engine.execution_options(isolation_level="READ COMMITTED")
        self.pid = pid
        self.host = host
        self.lease_clock = lease_clock
        self.key = LeaderKey.of(schedule)
        self.schedule = schedule

    def lease_params(self, now: datetime | None = None) -> dict[str, object]:
        """The :lease_now of a statement: None for the server's clock; on a test's
        clock the caller's ``now`` (read before any wait), else its reading now."""
        if self.lease_clock is None:
            return {"lease_now": None}
        return {"lease_now": now if now is not None else self.lease_clock.now()}


async def run_steps(conn: AsyncConnection, steps: Steps[_T]) -> _T:
    """Run ``steps`` on ``conn`` (in its transaction); return their answer."""
    try:
        statement = next(steps)
        while True:
            result = await conn.execute(*statement)
            statement = steps.send(result.all() if result.returns_rows else [])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def run_steps_sync(conn: Connection, steps: Steps[_T]) -> _T:
    """run_steps() on a sync connection, from any thread."""
    try:
        statement = next(steps)
        while True:
            result = conn.execute(*statement)
            statement = steps.send(result.all() if result.returns_rows else [])
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def iso(moment: datetime | None) -> str | None:
    """An aware datetime as PostgreSQL reads a timestamptz from text."""
    return None if moment is None else moment.isoformat()


def flag(value: bool) -> str:
    """A boolean as PostgreSQL reads it from text."""
    return "true" if value else "false"


def as_text(value: float | None) -> str | None:
    """A number (or None) as text, for a text[] array cast in SQL."""
    return None if value is None else str(value)


def lateness_ms(now: datetime, slot: datetime, jitter: float) -> int:
    """Milliseconds from the slot plus its jitter to ``now``; never below zero."""
    return max(0, int((now - slot - timedelta(seconds=jitter)).total_seconds() * 1000))


def read_committed(session: Session) -> Connection:
    """The session's connection at read committed, as JobStore's engine: under
    repeatable read a write that meets a concurrent update of the job row fails, and
    the outcome is lost."""
    return session.connection(execution_options={"isolation_level": "READ COMMITTED"})


def lease_reading(lease_clock: Clock | None) -> datetime | None:
    """The :lease_now of a statement: a test's lease clock now, None for the server's."""
    return None if lease_clock is None else lease_clock.now()
