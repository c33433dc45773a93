"""One drain pass: claim due rows a batch at a time, deliver them through a bounded
number of slots, and write their outcomes a batch at a time.

A pass holds one connection in autocommit: a claim is a single statement (its own
commit, so no transaction stays open across the network call), and so is each batch
of outcomes; they take turns on the connection.

At most ``concurrency`` deliveries run at once. A claim takes up to ``batch_size``
due rows, and only when a slot is free, so its first row starts at once; the rest
start as slots free up. The lease a claim sets is the delivery timeout plus a 30 s
margin, on the lease clock (the database server's: see app/scheduler/clock.py), so
that no drain's own clock decides whether another's claim still holds. A row starts
only within the first half of that margin (``_START_WINDOW_SECONDS`` after its claim,
on this process's monotonic clock: an elapsed time, which neither an offset between
hosts' clocks nor a step of this host's wall clock changes), checked as each delivery
begins, a drain's or an inline attempt's; ``asyncio.timeout`` cuts its delivery off at
delivery_timeout, so every
delivery ends at least 15 s before its lease runs out, and no other drain can claim a
row while it is being delivered. A row that could not start in time (slow
deliveries ahead of it, or a delivery task that began late) is given back, due now,
and claimed again with a fresh lease. The pass claims the next batch once every row of
the last one has started, and stops once a claim finds fewer rows than it asked for
and gave none back.

Outcomes are written by group commit: a delivery that ends adds its outcome to the
pass's list and waits for the connection; whoever gets it first writes every outcome
listed so far, one statement for the delivered rows and one for the failed ones. With
a fast receiver a batch holds many rows; with a slow one an outcome waits for no more
than the statement ahead of it. A pass that dies with outcomes unwritten leaves those
rows claimed until their lease runs out; the next drain delivers them again, under
the same idempotency key, which the receiver dedupes on.

Every outcome is written conditional on the row's claim token, and the statement
returns the rows it matched. A row it did not match is no longer this pass's (its
lease ran out while the process stalled, and another drain took it): its outcome is
not counted and is logged as ``outbox.claim_lost``.

Like a claim, an outcome write never waits on a row another transaction holds (an
operator's psql session left open on ``SELECT ... FOR UPDATE``): it writes the rows
no one else holds, so a held row holds up no other row's outcome. The held row's
outcome (``outbox.row_busy``) is retried with the pass's later writes, then alone at
the pass's end, waiting at most ROW_LOCK_PATIENCE a try (app/scheduler/rowlocks.py),
until it is written or its claim's lease has run out (``outbox.row_held``: counted
lost; the row is delivered again once free, under the same key).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import Clock
from app.scheduler.clock import lease_now
from app.scheduler.faults import is_busy_row
from app.scheduler.rowlocks import ROW_LOCK_PATIENCE
from app.scheduler.start_window import StartWindow
from app.storable import escape_unstorable

from . import sql
from .backoff import retry_delay
from .errors import PermanentDeliveryError
from .message import DrainReport, Message

__all__ = ["DrainPass", "DrainPolicy", "fetch", "prepare_connection"]

_DIALECT = postgresql.asyncpg.dialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]

logger = logging.getLogger("app.outbox")

_LEASE_MARGIN_SECONDS = 30.0
# Half the margin to start in, half to write the outcome in once the delivery ended.
_START_WINDOW_SECONDS = _LEASE_MARGIN_SECONDS / 2


@functools.cache
def _asyncpg_form(statement: TextClause) -> tuple[str, tuple[str, ...]]:
    """The statement as asyncpg SQL ($1, $2, ...) and its parameter names in order."""
    compiled = statement.compile(dialect=_DIALECT)
    return str(compiled), tuple(compiled.positiontup or ())


async def fetch(connection: Any, statement: TextClause, params: dict[str, Any]) -> list[Any]:
    """Run ``statement`` (SQLAlchemy text, ``:name`` parameters) on a plain asyncpg
    ``connection`` and return its rows."""
    query, names = _asyncpg_form(statement)
    return list(await connection.fetch(query, *(params[name] for name in names)))


async def prepare_connection(connection: Any) -> None:
    """Make a plain asyncpg connection (not the engine's) fit for drain passes: decode
    jsonb payloads as the engine's connections do (SQLAlchemy's asyncpg dialect
    registers the codec on those)."""
    await connection.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )


@dataclass(frozen=True)
class DrainPolicy:
    """How one outbox delivers: its receiver, limits and backoff."""

    outbox: str
    deliver: Callable[[Message], Awaitable[None]]
    max_attempts: int
    backoff: tuple[float, ...]
    concurrency: int
    delivery_timeout: float

    @property
    def lease(self) -> timedelta:
        """How long a claim keeps other drains off a row: the delivery timeout and a
        margin. A row starts within the first half of the margin or is given back, so
        a delivery that is still allowed to run is never claimed twice."""
        return timedelta(seconds=self.delivery_timeout + _LEASE_MARGIN_SECONDS)


@dataclass(frozen=True)
class Claim:
    """Rows claimed under one token. ``taken_at`` is this process's monotonic clock read
    just before the claim: the claim's start window and lease are measured from it, as
    elapsed times, which neither an offset between hosts' clocks nor a step of this
    host's wall clock (NTP) changes; the lease in the database runs from a later moment,
    so both end here no later than there."""

    token: uuid.UUID
    taken_at: float
    lease_seconds: float
    messages: list[Message]

    @property
    def window(self) -> StartWindow:
        """When a row of the claim may start: within _START_WINDOW_SECONDS of it."""
        return StartWindow(self.taken_at, _START_WINDOW_SECONDS)

    @property
    def lease_ends(self) -> float:
        """The monotonic moment by which the claim's lease has run out."""
        return self.taken_at + self.lease_seconds


@dataclass(frozen=True)
class _Outcome:
    """A delivery that ended, waiting for its outcome to be written. ``error`` is None
    for a delivered row."""

    claim: Claim
    message: Message
    error: str | None = None
    stuck: bool = False
    retry_in: float | None = None

    @property
    def name(self) -> str:
        if self.error is None:
            return "delivered"
        return "stuck" if self.stuck else "retried"

    @property
    def token(self) -> uuid.UUID:
        return self.claim.token


class DrainPass:
    """Claims, deliveries and outcome writes of one drain_once (or one inline attempt).

    ``connection`` is an asyncpg connection outside any transaction block: a pooled
    one's driver connection (``open``), or one made ready by prepare_connection."""

    def __init__(self, connection: Any, policy: DrainPolicy, clock: Clock) -> None:
        self._connection = connection
        self._turn = asyncio.Lock()
        self._ended: list[_Outcome] = []
        # Outcomes whose rows another transaction held when they were written.
        self._held: list[_Outcome] = []
        self.policy = policy
        self.clock = clock

    @classmethod
    @contextlib.asynccontextmanager
    async def open(
        cls, engine: AsyncEngine, policy: DrainPolicy, clock: Clock
    ) -> AsyncIterator[DrainPass]:
        """A pass on one pooled connection, used through its asyncpg driver connection:
        outside a transaction block each statement commits on its own, and the hot
        path skips SQLAlchemy's per-statement overhead."""
        async with engine.connect() as connection:
            raw = await connection.get_raw_connection()
            yield cls(raw.driver_connection, policy, clock)

    async def execute(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        """Run one statement (its own commit), taking turns with the pass's other writes."""
        async with self._turn:
            return await self._fetch(statement, params)

    async def drain(self, batch_size: int) -> DrainReport:
        """Claim due rows ``batch_size`` at a time and deliver them, at most
        ``concurrency`` at once, each starting within its claim's start window (or given
        back, due now), until a claim finds fewer rows than it asked for and none was
        given back; return the outcomes the database accepted. A database error stops
        the pass and is raised as itself."""
        report = DrainReport()
        slots = asyncio.Semaphore(self.policy.concurrency)
        waiting: collections.deque[Message] = collections.deque()
        claim: Claim | None = None
        exhausted = False
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    # A claim, too, waits for a free slot: its first row starts at once.
                    await slots.acquire()
                    if not waiting and not exhausted:
                        async with self._turn:
                            claim = await self._claim(sql.CLAIM_DUE, {"batch_size": batch_size})
                        waiting.extend(claim.messages)
                        exhausted = len(claim.messages) < batch_size
                    if not waiting:
                        slots.release()
                        break
                    assert claim is not None
                    if claim.window.closed(self.clock):
                        # Every row still waiting is of this claim: all are too late.
                        slots.release()
                        await self._release(claim.token, list(waiting))
                        waiting.clear()
                        exhausted = False
                        continue
                    message = waiting.popleft()
                    group.create_task(self._deliver_held(claim, message, slots, report))
        except ExceptionGroup as failed:
            # Every statement of the pass shares one connection: its first error (most
            # often the connection's loss) is why the pass stopped; say that, not "a
            # TaskGroup failed".
            raise failed.exceptions[0] from failed
        await self._write_held(report)
        return report

    async def attempt(self, message_id: int) -> DrainReport:
        """Claim row ``message_id`` if it is due and no drain holds it, deliver it and
        write its outcome, as drain does (its start window checked as the delivery
        begins); return the outcome the database accepted. A claim answered past its
        start window gives the row back and claims it once more, fresh; a second late
        answer leaves it to the drain, due now."""
        report = DrainReport()
        for _ in range(2):
            async with self._turn:
                claim = await self._claim(sql.CLAIM_ONE, {"id": message_id})
            if not claim.messages:
                break
            [message] = claim.messages
            if await self._begin(claim, message):
                self._ended.append(await self._attempt(claim, message))
                async with self._turn:
                    await self._write_ended(report)
                await self._write_held(report)
                break
        return report

    async def _fetch(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        return await fetch(self._connection, statement, params)

    async def _claim(self, statement: TextClause, params: dict[str, Any]) -> Claim:
        # Read before the claim: its start window ends no later than the lease allows.
        taken_at = self.clock.monotonic()
        token = uuid.uuid4()
        result = await self._fetch(
            statement,
            {
                "outbox": self.policy.outbox,
                "lease_now": lease_now(self.clock),
                "lease_seconds": self.policy.lease.total_seconds(),
                "token": token,
            }
            | params,
        )
        outbox = self.policy.outbox
        # SQLAlchemy's asyncpg dialect registers the jsonb codec: payloads arrive decoded.
        messages = [Message(r["id"], outbox, r["key"], r["payload"], r["attempts"]) for r in result]
        return Claim(token, taken_at, self.policy.lease.total_seconds(), messages)

    async def _begin(self, claim: Claim, message: Message) -> bool:
        """Whether the delivery of ``message`` may begin now; a row past its claim's
        start window is given back, due now. Checked as each delivery begins (a drain's
        or an inline attempt's), not only as its task is made or its claim answered: a
        delivery begins later than that when the loop is busy or frozen, or the claim's
        answer came late, and a row started past its window could outlive its lease
        beside another drain's claim of it."""
        if not claim.window.closed(self.clock):
            return True
        await self._release(claim.token, [message])
        return False

    async def _release(self, token: uuid.UUID, messages: list[Message]) -> None:
        async with self._turn:
            await self._fetch(
                sql.RELEASE,
                {
                    "ids": [m.id for m in messages],
                    "token": token,
                    "lease_now": lease_now(self.clock),
                },
            )

    async def _deliver_held(
        self, claim: Claim, message: Message, slots: asyncio.Semaphore, report: DrainReport
    ) -> None:
        try:
            if not await self._begin(claim, message):
                return
            outcome = await self._attempt(claim, message)
        finally:
            slots.release()
        self._ended.append(outcome)
        async with self._turn:
            await self._write_ended(report)

    async def _write_ended(self, report: DrainReport) -> None:
        """Write every outcome ended so far, with those of held rows not yet written
        (the caller holds the turn); count what the database accepted in ``report``."""
        # Empty when an earlier delivery's turn already wrote this outcome.
        held, ended = self._held, self._ended
        self._held, self._ended = [], []
        batch = held + ended
        for index, (outcome, accepted) in enumerate(
            zip(batch, await self._write(batch), strict=True)
        ):
            if accepted == "held":
                if index >= len(held):  # newly found held: said once
                    self._log_busy(outcome)
                self._held.append(outcome)
            else:
                setattr(report, accepted, getattr(report, accepted) + 1)

    async def _write_held(self, report: DrainReport) -> None:
        """Write the outcomes of rows another transaction held, once every other outcome
        of the pass is written: each row alone, in a transaction that waits for it at
        most ROW_LOCK_PATIENCE a try (that wait paces the tries), until it is written or
        its claim's lease has run out (then it is counted lost: the row is delivered
        again once free, under the same key)."""
        while self._held:
            outcome = self._held.pop(0)
            if self.clock.monotonic() >= outcome.claim.lease_ends:
                report.lost += 1
                self._log_held_past_lease(outcome)
                continue
            try:
                async with self._turn, self._connection.transaction():
                    await self._fetch(ROW_LOCK_PATIENCE, {})
                    await self._fetch(sql.LOCK_ROWS, {"ids": [outcome.message.id]})
                    [accepted] = await self._write([outcome])
            except Exception as exc:
                if not is_busy_row(exc):
                    raise
                accepted = "held"
            if accepted == "held":
                self._held.append(outcome)
            else:
                setattr(report, accepted, getattr(report, accepted) + 1)

    async def _attempt(self, claim: Claim, message: Message) -> _Outcome:
        try:
            async with asyncio.timeout(self.policy.delivery_timeout):
                await self.policy.deliver(message)
        except PermanentDeliveryError as exc:
            return self._failed(claim, message, exc, permanent=True)
        except Exception as exc:
            return self._failed(claim, message, exc, permanent=False)
        return _Outcome(claim, message)

    def _failed(
        self, claim: Claim, message: Message, exc: BaseException, *, permanent: bool
    ) -> _Outcome:
        attempts = message.attempts + 1
        error = escape_unstorable(f"{exc.__class__.__name__}: {exc}"[:2000])
        if isinstance(exc, TimeoutError):
            error = f"no answer within delivery_timeout={self.policy.delivery_timeout:g} s"
        return _Outcome(
            claim,
            message,
            error=error,
            stuck=permanent or attempts >= self.policy.max_attempts,
            retry_in=retry_delay(attempts, self.policy.backoff),
        )

    async def _write(self, batch: list[_Outcome]) -> list[str]:
        """Write ``batch`` (the caller holds the turn): one statement for its delivered
        rows, one for its failed rows; return what the database accepted, row by row,
        or ``held`` for a row another transaction held (nothing written; the claim still
        holds it), or ``lost``. A row not written costs one read more."""
        now = lease_now(self.clock)
        delivered = [o for o in batch if o.error is None]
        failed = [o for o in batch if o.error is not None]
        matched: set[int] = set()
        if delivered:
            rows = await self._fetch(
                sql.MARK_DELIVERED,
                {
                    "ids": [o.message.id for o in delivered],
                    "tokens": [o.token for o in delivered],
                    "lease_now": now,
                },
            )
            matched.update(row["id"] for row in rows)
        if failed:
            rows = await self._fetch(
                sql.MARK_FAILED,
                {
                    "ids": [o.message.id for o in failed],
                    "tokens": [o.token for o in failed],
                    "statuses": ["stuck" if o.stuck else "pending" for o in failed],
                    "attempts": [o.message.attempts + 1 for o in failed],
                    "retry_in": [o.retry_in for o in failed],
                    "errors": [o.error for o in failed],
                    "lease_now": now,
                },
            )
            matched.update(row["id"] for row in rows)
        unwritten = [o for o in batch if o.message.id not in matched]
        held: set[int] = set()
        if unwritten:
            rows = await self._fetch(
                sql.STILL_CLAIMED,
                {"ids": [o.message.id for o in unwritten], "tokens": [o.token for o in unwritten]},
            )
            held = {row["id"] for row in rows}
        return [
            self._accepted(o)
            if o.message.id in matched
            else "held"
            if o.message.id in held
            else self._lost(o)
            for o in batch
        ]

    def _log_busy(self, outcome: _Outcome) -> None:
        message = outcome.message
        logger.warning(
            "outbox.row_busy: %s row %s (key %s) is held by another transaction; its %s"
            " outcome is written once the row is free, within its lease, and no other"
            " row's outcome waits for it",
            self.policy.outbox,
            message.id,
            message.key,
            outcome.name,
            extra={"action": "outbox.row_busy", "outbox": self.policy.outbox, "row": message.id},
        )

    def _log_held_past_lease(self, outcome: _Outcome) -> None:
        message = outcome.message
        logger.warning(
            "outbox.row_held: %s row %s (key %s) stayed held by another transaction until"
            " its claim's lease ran out; its %s outcome was not recorded, and the row is"
            " delivered again, under the same key, once it is free: end that transaction"
            " (see pg_stat_activity)",
            self.policy.outbox,
            message.id,
            message.key,
            outcome.name,
            extra={"action": "outbox.row_held", "outbox": self.policy.outbox, "row": message.id},
        )

    def _accepted(self, outcome: _Outcome) -> str:
        if outcome.stuck:
            message = outcome.message
            logger.error(
                "outbox.stuck: %s row %s (key %s) after %s attempt(s): %s",
                self.policy.outbox,
                message.id,
                message.key,
                message.attempts + 1,
                outcome.error,
                extra={"action": "outbox.stuck", "outbox": self.policy.outbox, "row": message.id},
            )
        return outcome.name

    def _lost(self, outcome: _Outcome) -> str:
        message = outcome.message
        logger.warning(
            "outbox.claim_lost: %s row %s (key %s) is no longer held by this drain;"
            " its %s outcome was not recorded",
            self.policy.outbox,
            message.id,
            message.key,
            outcome.name,
            extra={"action": "outbox.claim_lost", "outbox": self.policy.outbox, "row": message.id},
        )
        return "lost"
