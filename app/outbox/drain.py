"""One drain pass: claim due rows, deliver them, commit each outcome on its own.

A pass holds one connection in autocommit: the claim is a single statement (its own
commit, so no transaction stays open across the network call) and so is each row's
outcome. Deliveries run concurrently up to the outbox's limit; their outcome writes
take turns on the pass's connection.
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
        margin, so a delivery that is still allowed to run is never claimed twice."""
        return timedelta(seconds=self.delivery_timeout + _LEASE_MARGIN_SECONDS)


class DrainPass:
    """Claims and deliveries of one drain_once (or one inline attempt)."""

    def __init__(self, connection: Any, policy: DrainPolicy, clock: Clock) -> None:
        self._connection = connection
        self._turn = asyncio.Lock()
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
        query, names = _asyncpg_form(statement)
        async with self._turn:
            return list(await self._connection.fetch(query, *(params[name] for name in names)))

    async def claim(
        self, statement: TextClause, params: dict[str, Any]
    ) -> tuple[uuid.UUID, list[Message]]:
        """Claim rows with ``statement`` (CLAIM_DUE or CLAIM_ONE) under a fresh token."""
        now = self.clock.now()
        token = uuid.uuid4()
        result = await self.execute(
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

    async def deliver_all(self, token: uuid.UUID, messages: list[Message]) -> DrainReport:
        """Deliver claimed messages, at most ``concurrency`` at once; count outcomes."""
        report = DrainReport()
        gate = asyncio.Semaphore(self.policy.concurrency)

        async def one(message: Message) -> None:
            async with gate:
                outcome = await self._deliver_one(token, message)
            setattr(report, outcome, getattr(report, outcome) + 1)

        async with asyncio.TaskGroup() as group:
            for message in messages:
                group.create_task(one(message))
        return report

    async def _deliver_one(self, token: uuid.UUID, message: Message) -> str:
        try:
            async with asyncio.timeout(self.policy.delivery_timeout):
                await self.policy.deliver(message)
        except PermanentDeliveryError as exc:
            return await self._fail(token, message, exc, permanent=True)
        except Exception as exc:
            return await self._fail(token, message, exc, permanent=False)
        await self.execute(
            sql.MARK_DELIVERED, {"id": message.id, "token": token, "now": self.clock.now()}
        )
        return "delivered"

    async def _fail(
        self, token: uuid.UUID, message: Message, exc: BaseException, *, permanent: bool
    ) -> str:
        attempts = message.attempts + 1
        stuck = permanent or attempts >= self.policy.max_attempts
        now = self.clock.now()
        error = f"{exc.__class__.__name__}: {exc}"[:2000]
        if isinstance(exc, TimeoutError):
            error = f"no answer within delivery_timeout={self.policy.delivery_timeout:g} s"
        await self.execute(
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
        if not stuck:
            return "retried"
        logger.error(
            "outbox.stuck: %s row %s (key %s) after %s attempt(s): %s",
            self.policy.outbox,
            message.id,
            message.key,
            attempts,
            error,
            extra={"action": "outbox.stuck", "outbox": self.policy.outbox, "row": message.id},
        )
        return "stuck"
