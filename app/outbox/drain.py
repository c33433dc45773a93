"""One drain pass: claim due rows into free delivery slots, deliver each at once, and
commit each outcome on its own.

A pass holds one connection in autocommit: a claim is a single statement (its own
commit, so no transaction stays open across the network call) and so is each row's
outcome; they take turns on the connection.

The pass holds at most ``concurrency`` rows at a time, each from its claim until its
outcome is written. It claims only into free slots, at most ``batch_size`` rows per
claim statement, so every claimed row starts delivering as soon as the claim returns:
the lease a claim sets (delivery_timeout plus a margin) runs from the row's own start
and covers its whole delivery, which ``asyncio.timeout`` cuts off at delivery_timeout.
A row never waits for a slot while its lease runs out. The pass stops claiming once a
claim finds fewer rows than it asked for, and ends when its deliveries have.

Every outcome write is conditional on the claim's token and says whether it matched.
One that matched nothing means the row is no longer this pass's (its lease ran out
while the process stalled, and another drain took it): the outcome is not counted and
is logged as ``outbox.claim_lost``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
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
from app.scheduler.store import storable

from . import sql
from .backoff import retry_delay
from .errors import PermanentDeliveryError
from .message import DrainReport, Message

__all__ = ["DrainPass", "DrainPolicy"]

_DIALECT = postgresql.asyncpg.dialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]

logger = logging.getLogger("app.outbox")

_LEASE_MARGIN_SECONDS = 30.0


@functools.cache
def _asyncpg_form(statement: TextClause) -> tuple[str, tuple[str, ...]]:
    """The statement as asyncpg SQL ($1, $2, ...) and its parameter names in order."""
    compiled = statement.compile(dialect=_DIALECT)
    return str(compiled), tuple(compiled.positiontup or ())


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
        margin. A row starts delivering as soon as it is claimed, so a delivery that is
        still allowed to run is never claimed twice."""
        return timedelta(seconds=self.delivery_timeout + _LEASE_MARGIN_SECONDS)


class DrainPass:
    """Claims and deliveries of one drain_once (or one inline attempt)."""

    def __init__(self, connection: Any, policy: DrainPolicy, clock: Clock) -> None:
        self._connection = connection
        self._turn = asyncio.Lock()
        self._held = 0
        self._slot_freed = asyncio.Event()
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

    async def claim(
        self, statement: TextClause, params: dict[str, Any]
    ) -> tuple[uuid.UUID, list[Message]]:
        """Claim rows with ``statement`` (CLAIM_DUE or CLAIM_ONE) under a fresh token.
        The caller starts delivering them at once: their lease runs from now."""
        async with self._turn:
            return await self._claim(statement, params)

    async def drain(self, batch_size: int) -> DrainReport:
        """Claim due rows into free slots and deliver each as soon as it is claimed,
        at most ``concurrency`` at once, until a claim finds fewer rows than it asked
        for; return the outcomes the database accepted. A database error stops the
        pass and is raised as itself."""
        report = DrainReport()
        try:
            async with asyncio.TaskGroup() as group:
                while True:
                    while self._held >= self.policy.concurrency:
                        self._slot_freed.clear()
                        await self._slot_freed.wait()
                    async with self._turn:
                        # Counted once the turn is ours: outcome writes queued ahead of
                        # this claim have freed their slots by now, so a pass with a fast
                        # receiver claims a full set of slots, not one row per claim.
                        limit = min(batch_size, self.policy.concurrency - self._held)
                        token, messages = await self._claim(sql.CLAIM_DUE, {"batch_size": limit})
                        self._held += len(messages)
                    for message in messages:
                        group.create_task(self._deliver_held(token, message, report))
                    if len(messages) < limit:
                        break
        except ExceptionGroup as failed:
            # Every statement of the pass shares one connection: its first error (most
            # often the connection's loss) is why the pass stopped; say that, not "a
            # TaskGroup failed".
            raise failed.exceptions[0] from failed
        return report

    async def deliver(self, token: uuid.UUID, message: Message) -> str:
        """Deliver one claimed message and write its outcome under ``token``; return
        what the database accepted: delivered, retried, stuck, or lost (the row is no
        longer held by ``token``, and nothing was written)."""
        try:
            async with asyncio.timeout(self.policy.delivery_timeout):
                await self.policy.deliver(message)
        except PermanentDeliveryError as exc:
            return await self._fail(token, message, exc, permanent=True)
        except Exception as exc:
            return await self._fail(token, message, exc, permanent=False)
        accepted = await self.execute(
            sql.MARK_DELIVERED, {"id": message.id, "token": token, "now": self.clock.now()}
        )
        return "delivered" if accepted else self._lost(message, "delivered")

    async def _fetch(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        query, names = _asyncpg_form(statement)
        return list(await self._connection.fetch(query, *(params[name] for name in names)))

    async def _claim(
        self, statement: TextClause, params: dict[str, Any]
    ) -> tuple[uuid.UUID, list[Message]]:
        now = self.clock.now()
        token = uuid.uuid4()
        result = await self._fetch(
            statement,
            {
                "outbox": self.policy.outbox,
                "now": now,
                "lease_until": now + self.policy.lease,
                "token": token,
            }
            | params,
        )
        outbox = self.policy.outbox
        # SQLAlchemy's asyncpg dialect registers the jsonb codec: payloads arrive decoded.
        return token, [
            Message(r["id"], outbox, r["key"], r["payload"], r["attempts"]) for r in result
        ]

    async def _deliver_held(self, token: uuid.UUID, message: Message, report: DrainReport) -> None:
        try:
            outcome = await self.deliver(token, message)
            setattr(report, outcome, getattr(report, outcome) + 1)
        finally:
            self._held -= 1
            self._slot_freed.set()

    async def _fail(
        self, token: uuid.UUID, message: Message, exc: BaseException, *, permanent: bool
    ) -> str:
        attempts = message.attempts + 1
        stuck = permanent or attempts >= self.policy.max_attempts
        outcome = "stuck" if stuck else "retried"
        now = self.clock.now()
        error = storable(f"{exc.__class__.__name__}: {exc}"[:2000])
        if isinstance(exc, TimeoutError):
            error = f"no answer within delivery_timeout={self.policy.delivery_timeout:g} s"
        accepted = await self.execute(
            sql.MARK_FAILED,
            {
                "id": message.id,
                "token": token,
                "now": now,
                "status": "stuck" if stuck else "pending",
                "attempts": attempts,
                "next_attempt_at": now
                + timedelta(seconds=retry_delay(attempts, self.policy.backoff)),
                "error": error,
            },
        )
        if not accepted:
            return self._lost(message, outcome)
        if stuck:
            logger.error(
                "outbox.stuck: %s row %s (key %s) after %s attempt(s): %s",
                self.policy.outbox,
                message.id,
                message.key,
                attempts,
                error,
                extra={"action": "outbox.stuck", "outbox": self.policy.outbox, "row": message.id},
            )
        return outcome

    def _lost(self, message: Message, outcome: str) -> str:
        logger.warning(
            "outbox.claim_lost: %s row %s (key %s) is no longer held by this drain;"
            " its %s outcome was not recorded",
            self.policy.outbox,
            message.id,
            message.key,
            outcome,
            extra={"action": "outbox.claim_lost", "outbox": self.policy.outbox, "row": message.id},
        )
        return "lost"
