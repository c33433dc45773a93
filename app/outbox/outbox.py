"""An outbox: rows written in the caller's transaction, delivered by a drain.

The drain claims due rows with ``FOR UPDATE SKIP LOCKED`` under a delivery lease,
``batch_size`` at a time, and delivers at most ``concurrency`` at once; a row starts
only while its lease still covers its whole delivery (else it is given back), and its
outcome is written with others of the pass in one statement, only while its claim
still holds the row. Leases and due times are read on the database server's clock
(the lease clock, app/scheduler/clock.py), never on a host's. A drain killed
mid-delivery or before writing a batch leaves its rows to be retried when the lease
runs out; the receiver deduplicates on the idempotency key. A row another transaction
holds delays no other row's outcome. A reset (resets.py) never takes a row from a live
claim.
The outbox deletes nothing but delivered rows past OUTBOX_DELIVERED_DAYS (retention.py;
an operator may forget a retired outbox: app/admin).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from app.backoff import Backoff
from app.scheduler import Clock, JobContext, Scheduler, SystemClock, Trigger, every
from app.scheduler.clock import lease_now

from . import sql
from .arguments import (
    check_count,
    check_deliver,
    check_key,
    check_name,
    check_scheduler,
    check_seconds,
    check_table,
    deliver_when,
)
from .drain import DrainPass
from .errors import (
    OutboxArgumentError,
    OutboxError,
    OutboxNameTakenError,
)
from .message import DrainReport, Enqueued, Message
from .payload import dump_payload
from .policy import DEFAULT_BACKOFF, DrainPolicy
from .resets import reset_message
from .wakeup import listen_and_drain

__all__ = ["Deliver", "Outbox", "drain_job_id"]

logger = logging.getLogger("app.outbox")

Deliver = Callable[[Message], Awaitable[None]]

_LIVE: weakref.WeakValueDictionary[str, Outbox] = weakref.WeakValueDictionary()


def drain_job_id(name: str) -> str:
    """The id of the drain job of the outbox named ``name``, ``outbox_<name>_drain``:
    while the schedule that claimed the name registers it, an app drains the outbox."""
    return f"outbox_{name}_drain"


class Outbox:
    """A named outbox and its drain.

    ``deliver(message)`` is an async callable: it returns on success, raises
    PermanentDeliveryError to make the row stuck, and raises anything else to retry.
    Pass ``scheduler=`` (or call ``register``) to put its drain job, every minute by
    default, and its NOTIFY wake-up service on that scheduler.

    Raises OutboxArgumentError, naming the argument and its limit, for a name that is
    not 1 to MAX_NAME_LENGTH ASCII letters, digits and underscores, a ``deliver`` that is
    not callable, counts that are not ints from 1, seconds that are not finite numbers
    of at most ten years (``delivery_timeout`` above zero), an empty ``backoff``, a
    ``drain_every`` that is not a trigger, or a ``scheduler`` that is not a Scheduler.
    """

    def __init__(
        self,
        name: str,
        deliver: Deliver,
        *,
        scheduler: Scheduler | None = None,
        max_attempts: int | None = None,
        backoff: Sequence[float] = DEFAULT_BACKOFF,
        batch_size: int = 50,
        concurrency: int = 10,
        delivery_timeout: float = 30,
        drain_every: Trigger | None = None,
    ) -> None:
        check_name(name)
        check_deliver(name, deliver)
        check_count(name, "max_attempts", max_attempts, optional=True)
        check_count(name, "batch_size", batch_size)
        check_count(name, "concurrency", concurrency)
        check_seconds(name, "delivery_timeout", delivery_timeout, above_zero=True)
        backoff = check_table(name, "backoff", backoff)
        if drain_every is not None and not isinstance(drain_every, Trigger):
            raise OutboxArgumentError(
                "drain_every", drain_every, "drain_every must be a trigger: every(...) or cron(...)"
            )
        self.name = name
        self.deliver = deliver
        self.max_attempts = max_attempts
        self.backoff = tuple(backoff)
        self.batch_size = batch_size
        self.concurrency = concurrency
        self.delivery_timeout = delivery_timeout
        self.drain_every = drain_every or every(minutes=1)
        self.clock: Clock = SystemClock()
        self._engine: AsyncEngine | None = None
        self._listen_dsn: str | None = None
        self._default_max_attempts = 24
        self.scheduler: Scheduler | None = None
        if scheduler is not None:
            self.register(scheduler)
        # A newer outbox of the same name takes the name over (a rebuilt app, in tests);
        # two on one scheduler still collide on the drain job's id. Only once built: a
        # refused one would take it from the outbox the app drains.
        _LIVE[name] = self

    @property
    def drain_job_id(self) -> str:
        """``outbox_<name>_drain`` (drain_job_id(name))."""
        return drain_job_id(self.name)

    @classmethod
    def live(cls) -> list[Outbox]:
        """Every outbox that exists in this process."""
        return list(_LIVE.values())

    def register(self, scheduler: Scheduler) -> None:
        """Put the drain job and the NOTIFY wake-up service on ``scheduler``. Raises
        OutboxArgumentError naming ``scheduler`` for one that is not a Scheduler."""
        check_scheduler(self.name, scheduler)
        scheduler.job(self.drain_every, id=self.drain_job_id, name=f"Deliver queued {self.name}")(
            self._drain_job
        )
        scheduler.service(id=f"outbox_{self.name}_wakeup", name=f"Wake {self.name} drain")(
            self._wakeup_service
        )
        self.scheduler = scheduler

    def bind(
        self,
        engine: AsyncEngine,
        *,
        listen_dsn: str,
        clock: Clock | None = None,
        default_max_attempts: int = 24,
    ) -> None:
        """Give the outbox its database, the DSN its wake-up listener connects to, and
        (for tests) a clock. The app does this at start-up for every outbox, with
        OUTBOX_MAX_ATTEMPTS as the default for outboxes that set no max_attempts."""
        self._engine = engine
        self._listen_dsn = listen_dsn
        self._default_max_attempts = default_max_attempts
        if clock is not None:
            self.clock = clock

    async def claim_name(self, schedule: str) -> None:
        """Claim this outbox's name for the schedule named ``schedule`` in the bound
        database (table outbox_schedules), once; later claims of the same schedule only
        read. The app does this at start-up, before its scheduler starts.

        Raises OutboxNameTakenError when another schedule claimed the name first: the
        rows of an outbox name are one set per database, and two apps draining it would
        deliver each other's rows.
        """
        owners: list[str] = []
        while not owners:
            async with self.engine.begin() as conn:
                result = await conn.execute(
                    sql.CLAIM_NAME, {"outbox": self.name, "schedule": schedule}
                )
                owners = list(result.scalars())
        for owner in owners:
            if owner != schedule:
                raise OutboxNameTakenError(self.name, owner, schedule)

    @property
    def engine(self) -> AsyncEngine:
        """The bound engine. Raises OutboxError before bind()."""
        if self._engine is None:
            raise OutboxError(f"outbox {self.name!r} is not bound to a database; call bind()")
        return self._engine

    async def enqueue(
        self,
        session: AsyncSession,
        payload: Any,
        *,
        key: str,
        at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> Enqueued:
        """Add a row inside the caller's transaction; commit is the caller's.

        The row is due at once, or at ``at`` (an aware datetime), or ``delay`` (a
        timedelta) after the insert; either is read on the lease clock (the database
        server's: see app/scheduler/clock.py), and the row is never delivered before
        it. The wake-up sleeps until the earliest such moment, so it is delivered soon
        after. A key the outbox already has adds nothing and returns that row
        (``created=False``, its moment unchanged); a key whose row retention deleted
        (delivered more than OUTBOX_DELIVERED_DAYS ago), even while this enqueue runs,
        is free again and adds a new row. The drain is woken by NOTIFY once the caller
        commits.

        Raises, before writing anything: OutboxArgumentError naming ``key`` (not a
        non-empty str PostgreSQL can store, or past MAX_KEY_BYTES), ``at`` (naive, more
        than ten years ahead, or given with ``delay``) or ``delay`` (not a timedelta
        from 0 to ten years); PayloadError naming a field that jsonb cannot store.

        A float reaches the deliverer as the float it was: one of magnitude 1e16 or more
        (whose repr has an exponent, which jsonb's numeric would give back as an int)
        is stored in positional form with a ``.0`` (``10000000000000000.0``).
        """
        params = self._insert_params(payload, key, at, delay)
        row_id = (await session.execute(sql.INSERT, params)).scalar()
        if row_id is None:
            existing = (await session.execute(sql.SELECT_EXISTING, params)).scalar()
            if existing is not None:
                return Enqueued(existing, created=False)
            # The row that had the key went since the insert met it (retention deleted
            # it, delivered): the key is free again, and this is a new message.
            row_id = (await session.execute(sql.INSERT, params)).scalar_one()
        return Enqueued(row_id, created=True)

    def enqueue_sync(
        self,
        session: Session | Connection,
        payload: Any,
        *,
        key: str,
        at: datetime | None = None,
        delay: timedelta | None = None,
    ) -> Enqueued:
        """enqueue() for thread jobs and sync code: same contract, sync session."""
        params = self._insert_params(payload, key, at, delay)
        row_id = session.execute(sql.INSERT, params).scalar()
        if row_id is None:
            existing = session.execute(sql.SELECT_EXISTING, params).scalar()
            if existing is not None:
                return Enqueued(existing, created=False)
            # As in enqueue(): the row that had the key went meanwhile.
            row_id = session.execute(sql.INSERT, params).scalar_one()
        return Enqueued(row_id, created=True)

    async def drain_once(self) -> DrainReport:
        """Deliver every due row, batch by batch, until none is due; return the counts.

        Safe to run from any number of processes at once: a row is claimed by one
        drain at a time, starts only while its claim's lease covers its whole delivery,
        and its outcome is committed in a batch, each row under its own claim. The
        counts are the outcomes the database accepted.
        """
        async with DrainPass.open(self.engine, self._policy(), self.clock) as drain:
            return await self._drain(drain)

    async def drain_on(self, connection: Any) -> DrainReport:
        """drain_once() on ``connection``, a plain asyncpg connection made ready by
        prepare_connection and open in no transaction (the wake-up's LISTEN connection):
        no pool checkout, so no pre-ping round trips, between a NOTIFY and the claim.
        Same contract as drain_once()."""
        return await self._drain(DrainPass(connection, self._policy(), self.clock))

    async def _drain(self, drain: DrainPass) -> DrainReport:
        report = await drain.drain(self.batch_size)
        await drain.execute(
            sql.RECORD_DRAIN,
            {
                "outbox": self.name,
                "lease_now": lease_now(self.clock),
                "delivered": report.delivered,
                "retried": report.retried,
                "stuck": report.stuck,
            },
        )
        return report

    async def attempt(self, message_id: int) -> None:
        """Try one row now, through the same claim and start window as the drain (for
        a route's BackgroundTasks after its commit). Never raises: the drain is the durability
        half, and a row another drain holds is left to it."""
        try:
            async with DrainPass.open(self.engine, self._policy(), self.clock) as drain:
                await drain.attempt(message_id)
        except Exception:
            logger.warning(
                "outbox.inline_failed: %s row %s left to the drain",
                self.name,
                message_id,
                exc_info=True,
                extra={"action": "outbox.inline_failed", "outbox": self.name},
            )

    async def reset(self, message_id: int) -> None:
        """Make a stuck row, or a pending one no drain holds, due now with attempts 0;
        see reset_message for what is refused."""
        await reset_message(self.engine, self.name, message_id, lease_now(self.clock))

    def _insert_params(self, payload: Any, key: str, at: object, delay: object) -> dict[str, Any]:
        check_key(self.name, key)
        deliver_at, after = deliver_when(self.name, at, delay, self.clock)
        return {
            "outbox": self.name,
            "key": key,
            "payload": dump_payload(self.name, payload),
            "lease_now": lease_now(self.clock),
            "deliver_at": deliver_at,
            "delay": after,
        }

    def _policy(self) -> DrainPolicy:
        return DrainPolicy(
            outbox=self.name,
            deliver=self.deliver,
            max_attempts=self.max_attempts or self._default_max_attempts,
            backoff=Backoff.of(self.backoff),
            concurrency=self.concurrency,
            delivery_timeout=self.delivery_timeout,
        )

    async def _drain_job(self, ctx: JobContext) -> None:
        report = await self.drain_once()
        if report.delivered or report.retried or report.stuck or report.lost:
            ctx.log.info(
                "outbox %s drained: %s delivered, %s retried, %s stuck, %s claim(s) lost",
                self.name,
                report.delivered,
                report.retried,
                report.stuck,
                report.lost,
            )

    async def _wakeup_service(self, ctx: object) -> None:
        if self._listen_dsn is None:
            raise OutboxError(f"outbox {self.name!r} is not bound to a database; call bind()")
        await listen_and_drain(self._listen_dsn, self.name, self.drain_on, self.clock)
