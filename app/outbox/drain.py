"""One drain pass: claim due rows a batch at a time, deliver them through a bounded
number of slots, and write their outcomes a batch at a time.

A pass holds one connection in autocommit: a claim is a single statement (its own
commit, so no transaction stays open across the network call), and so is each batch
of outcomes; they take turns on the connection.

At most ``concurrency`` deliveries run at once. A claim (claim.py) takes up to
``batch_size`` due rows, and only when a slot is free, so its first row starts at
once; the rest start as slots free up. Each row starts only within its claim's start
window, checked as its delivery begins (a drain's or an inline attempt's); a row that
could not start in time (slow deliveries ahead of it, or a delivery task that began
late) is given back, due now, and claimed again with a fresh lease. The pass claims
the next batch once every row of the last one has started, and stops once a claim
finds fewer rows than it asked for and gave none back. Each delivery (delivery.py)
ends in an outcome, written by group commit (outcomes.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import Clock

from . import sql
from .claim import Claim, release
from .connection import fetch
from .delivery import deliver
from .message import DrainReport, Message
from .outcomes import PassOutcomes
from .policy import DrainPolicy

__all__ = ["DrainPass"]


class DrainPass:
    """Claims, deliveries and outcome writes of one drain_once (or one inline attempt).

    ``connection`` is an asyncpg connection outside any transaction block: a pooled
    one's driver connection (``open``), or one made ready by prepare_connection."""

    def __init__(self, connection: Any, policy: DrainPolicy, clock: Clock) -> None:
        self._connection = connection
        self._turn = asyncio.Lock()
        self._outcomes = PassOutcomes(connection, self._turn, policy, clock)
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
            return await fetch(self._connection, statement, params)

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
                        await self._release(claim, list(waiting))
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
        await self._outcomes.write_held(report)
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
                await self._outcomes.write(await deliver(self.policy, claim, message), report)
                await self._outcomes.write_held(report)
                break
        return report

    async def _claim(self, statement: TextClause, params: dict[str, Any]) -> Claim:
        return await Claim.take(self._connection, statement, params, self.policy, self.clock)

    async def _begin(self, claim: Claim, message: Message) -> bool:
        """Whether the delivery of ``message`` may begin now; a row past its claim's
        start window is given back, due now. Checked as each delivery begins (a drain's
        or an inline attempt's), not only as its task is made or its claim answered: a
        delivery begins later than that when the loop is busy or frozen, or the claim's
        answer came late, and a row started past its window could outlive its lease
        beside another drain's claim of it."""
        if not claim.window.closed(self.clock):
            return True
        await self._release(claim, [message])
        return False

    async def _release(self, claim: Claim, messages: list[Message]) -> None:
        async with self._turn:
            await release(self._connection, claim.token, messages, self.clock)

    async def _deliver_held(
        self, claim: Claim, message: Message, slots: asyncio.Semaphore, report: DrainReport
    ) -> None:
        try:
            if not await self._begin(claim, message):
                return
            outcome = await deliver(self.policy, claim, message)
        finally:
            slots.release()
        await self._outcomes.write(outcome, report)
