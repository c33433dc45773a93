"""The outcomes of one drain pass, written by group commit, each only while its claim
still holds its row.

A delivery that ends adds its outcome to the pass's list and waits for the
connection; whoever gets it first writes every outcome listed so far, one statement
for the delivered rows and one for the failed ones. With a fast receiver a batch holds
many rows; with a slow one an outcome waits for no more than the statement ahead of
it. A pass that dies with outcomes unwritten leaves those rows claimed until their
lease runs out; the next drain delivers them again, under the same idempotency key,
which the receiver dedupes on.

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
import logging
from typing import Any

from sqlalchemy import TextClause

from app.scheduler import Clock
from app.scheduler.clock import lease_now
from app.scheduler.faults import is_busy_row
from app.scheduler.rowlocks import ROW_LOCK_PATIENCE

from . import sql
from .connection import fetch
from .delivery import Outcome
from .message import DrainReport
from .policy import DrainPolicy

__all__ = ["PassOutcomes"]

logger = logging.getLogger("app.outbox")


class PassOutcomes:
    """The outcomes of one pass's deliveries, written on the pass's ``connection`` in
    turns with its claims (``turn``), and counted in its DrainReport as the database
    accepted them."""

    def __init__(
        self, connection: Any, turn: asyncio.Lock, policy: DrainPolicy, clock: Clock
    ) -> None:
        self._connection = connection
        self._turn = turn
        self._ended: list[Outcome] = []
        # Outcomes whose rows another transaction held when they were written.
        self._held: list[Outcome] = []
        self.policy = policy
        self.clock = clock

    async def write(self, outcome: Outcome, report: DrainReport) -> None:
        """List ``outcome``, then, in the connection's turn, write every outcome listed
        so far, with those of held rows not yet written; count what the database
        accepted in ``report``. An outcome an earlier turn wrote is not written again."""
        self._ended.append(outcome)
        async with self._turn:
            await self._write_ended(report)

    async def write_held(self, report: DrainReport) -> None:
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

    async def _fetch(self, statement: TextClause, params: dict[str, Any]) -> list[Any]:
        return await fetch(self._connection, statement, params)

    async def _write_ended(self, report: DrainReport) -> None:
        """Write every outcome ended so far, with those of held rows not yet written
        (the caller holds the turn); count what the database accepted in ``report``."""
        if not self._ended and not self._held:
            return  # an earlier delivery's turn already wrote this outcome
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

    async def _write(self, batch: list[Outcome]) -> list[str]:
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

    def _log_busy(self, outcome: Outcome) -> None:
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

    def _log_held_past_lease(self, outcome: Outcome) -> None:
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

    def _accepted(self, outcome: Outcome) -> str:
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

    def _lost(self, outcome: Outcome) -> str:
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
