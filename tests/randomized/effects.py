"""Side effects as the outside world saw them: job bodies, services, the receiver.

The invariants are checked against these records and the database, never against log
order. Job bodies may run in worker threads, so the recorder takes a lock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import asyncpg

from app.outbox import DrainReport, Message, Outbox, PermanentDeliveryError
from app.scheduler import Clock

__all__ = ["CountingOutbox", "Delivery", "DrainRun", "Receiver", "Recorder"]


class Recorder:
    """What the job bodies and the service did, and every broken guarantee seen at the
    moment it happened (a second run of a slot, a job overlapping itself, two workers
    firing at once, a service on two workers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.starts: collections.Counter[tuple[str, datetime]] = collections.Counter()
        self.completed: set[tuple[str, datetime]] = set()
        self.active: dict[str, list[tuple[str, datetime]]] = collections.defaultdict(list)
        self.services: list[str] = []
        self.violations: list[str] = []

    def body_started(
        self,
        job: str,
        slot: datetime,
        node: str,
        leading: list[str],
        firing: list[str],
        nodes: str = "",
    ) -> None:
        """A leader body of ``job`` for ``slot`` starts on ``node``; ``leading`` are the
        nodes that lead (or fire unguarded) right now, ``firing`` those whose job loops
        run (a body claimed before its node began to step down starts a moment later);
        ``nodes`` says what every node was doing then (for the report)."""
        with self._lock:
            self.starts[(job, slot)] += 1
            if self.starts[(job, slot)] > 1:
                self.violations.append(f"slot run twice: {job} {slot.isoformat()} (on {node})")
            if self.active[job]:
                self.violations.append(
                    f"{job} overlaps itself: slot {slot.isoformat()} started on {node} while "
                    f"{[(n, s.isoformat()) for n, s in self.active[job]]} still run"
                )
            if node not in leading:
                self.violations.append(
                    f"{job} {slot.isoformat()} ran on {node}, which does not lead ({nodes})"
                )
            if len(firing) > 1:
                self.violations.append(f"{firing} fire at once ({job} {slot.isoformat()}; {nodes})")
            self.active[job].append((node, slot))

    def body_ended(self, job: str, slot: datetime, node: str, *, completed: bool) -> None:
        """The body ended; ``completed`` when it returned rather than being cancelled."""
        with self._lock:
            self.active[job].remove((node, slot))
            if completed:
                self.completed.add((job, slot))

    def snapshot(self) -> tuple[dict[tuple[str, datetime], int], set[tuple[str, datetime]]]:
        """Copies of the body starts and completions, taken under the lock."""
        with self._lock:
            return dict(self.starts), set(self.completed)

    def bodies_running(self) -> bool:
        """True while any job body runs somewhere."""
        with self._lock:
            return any(self.active.values())

    def is_running(self, job: str, slot: datetime) -> bool:
        """True while a body of that slot runs somewhere."""
        with self._lock:
            return any(running == slot for _, running in self.active[job])

    def service_started(self, node: str, nodes: str = "") -> None:
        """The leader-only service started on ``node``; ``nodes`` says what every node
        was doing then (for the report)."""
        with self._lock:
            if self.services:
                self.violations.append(
                    f"service started on {node} while it runs on {self.services} ({nodes})"
                )
            self.services.append(node)

    def service_stopped(self, node: str) -> None:
        """The service on ``node`` ended."""
        with self._lock:
            self.services.remove(node)

    def violation(self, message: str) -> None:
        """Note a broken guarantee found outside the recorder."""
        with self._lock:
            self.violations.append(message)


class DrainRun:
    """One drain pass, as the receiver's calls see it: ended once the pass returned or
    raised (its unwritten outcomes, if any, will never be written); ``died`` when it
    raised or was cancelled (a demotion, a lost connection)."""

    def __init__(self) -> None:
        self.ended = False
        self.died = False


# The drain pass a receiver call belongs to: its delivery tasks inherit the context.
_DRAIN_RUN: contextvars.ContextVar[DrainRun | None] = contextvars.ContextVar(
    "drain_run", default=None
)


@dataclass(frozen=True)
class Claimed:
    """A row as the database held it when a receiver call began: its lease and the
    token of the claim that holds it (both None when the server could not be asked)."""

    lease_until: datetime | None = None
    token: uuid.UUID | None = None


@dataclass(frozen=True)
class Ended:
    """A receiver call that ended (returned or raised) inside a drain pass: its
    outcome is the pass's to write, under ``token``."""

    row_id: int
    token: uuid.UUID | None
    run: DrainRun | None


@dataclass
class Delivery:
    """One call of the receiver that returned: a delivery the remote side accepted.

    ``lease_until`` is the row's lease as the database held it when the call began."""

    start: datetime
    end: datetime
    lease_until: datetime | None
    run: DrainRun | None = None

    @property
    def overran_its_lease(self) -> bool:
        """Began inside its lease and ended at or after its end: the clock jumped
        mid-call (a frozen process). A claim takes a row whose lease ends by now
        (next_attempt_at <= now), so from the lease's last instant on another drain may
        deliver the row again."""
        return self.lease_until is not None and self.start < self.lease_until <= self.end

    @property
    def may_come_again(self) -> bool:
        """Another drain may deliver the row again: the call overran its lease, or its
        pass died before writing the outcome (the design retries such rows, under the
        same key, once the lease runs out)."""
        return self.overran_its_lease or (self.run is not None and self.run.died)


@dataclass
class Receiver:
    """The remote system of the outbox. Each key behaves as its enqueue step said:
    ``fast``, ``slow:<fake seconds>``, ``fail:<times>``, ``permanent`` or ``hang``.
    Once ``healed``, every key but the permanent ones answers at once."""

    clock: Clock
    dsn: str
    recorder: Recorder
    behaviours: dict[str, str] = field(default_factory=dict)
    calls: collections.Counter[str] = field(default_factory=collections.Counter)
    accepted: dict[str, list[Delivery]] = field(
        default_factory=lambda: collections.defaultdict(list)
    )
    healed: bool = False
    # Calls under way that are not parked on the fake clock or hanging: real-time work.
    busy: collections.Counter[str] = field(default_factory=collections.Counter)
    # The last call of each key that ended, whose outcome its pass has to write, and
    # how many calls have ended so far (a reader of the rows' claims compares it).
    ended: dict[str, Ended] = field(default_factory=dict)
    ends: int = 0
    _looking: asyncio.Lock = field(default_factory=asyncio.Lock)
    _connection: asyncpg.Connection | None = None

    async def __call__(self, message: Message) -> None:
        key = message.key
        self.calls[key] += 1
        start = self.clock.now()
        claimed = Claimed()
        try:
            with self._busy(key):
                claimed = await self._claim_of(message.id)
                await self._answer(key)
            delivery = Delivery(start, self.clock.now(), claimed.lease_until, _DRAIN_RUN.get())
            earlier = self.accepted[key]
            # Each delivery that may come again let one more drain deliver the key,
            # whichever of the two ended first.
            excused = sum(d.may_come_again for d in (*earlier, delivery))
            if len(earlier) > excused:
                self.recorder.violation(
                    f"outbox key {key} delivered {len(earlier) + 1} times: {earlier}, again "
                    f"{delivery}"
                )
            earlier.append(delivery)
        finally:
            self.ended[key] = Ended(message.id, claimed.token, _DRAIN_RUN.get())
            self.ends += 1

    async def _answer(self, key: str) -> None:
        """Behave as the key's behaviour says; parked (not busy) while waiting on time."""
        behaviour = self.behaviours[key]
        if self.healed and behaviour != "permanent":
            behaviour = "fast"
        kind, _, amount = behaviour.partition(":")
        if kind == "slow":
            with self._parked(key):
                await self.clock.sleep(float(amount))
        elif kind == "fail" and self.calls[key] <= int(amount):
            raise ConnectionError(f"receiver refused {key} (call {self.calls[key]})")
        elif kind == "permanent":
            raise PermanentDeliveryError(f"receiver rejects {key} for good")
        elif kind == "hang":
            with self._parked(key):
                await asyncio.Event().wait()

    @contextlib.contextmanager
    def _busy(self, key: str) -> Iterator[None]:
        self.busy[key] += 1
        try:
            yield
        finally:
            self.busy[key] -= 1

    @contextlib.contextmanager
    def _parked(self, key: str) -> Iterator[None]:
        self.busy[key] -= 1
        try:
            yield
        finally:
            self.busy[key] += 1

    def in_flight(self, held: dict[int, uuid.UUID | None]) -> list[str]:
        """What the outbox is doing in real time right now, given the claim token that
        holds each row (``held``, by row id): calls under way and not parked on the
        clock, and ended calls whose outcome their live pass has not written yet (the
        row is still held by the claim the call was made under). Time must not move
        meanwhile: to the drain, a clock moved now is a process frozen mid-write.
        ``held`` must be read after the last call ended (``ends`` unchanged across the
        read): read before a row was claimed, it hides that row's unwritten outcome."""
        doing = [f"the receiver is answering {key}" for key, n in self.busy.items() if n]
        for key, call in self.ended.items():
            alive = call.run is not None and not call.run.ended
            if alive and call.token is not None and held.get(call.row_id) == call.token:
                doing.append(f"the outcome of {key} is not written yet")
        return doing

    async def _claim_of(self, row_id: int) -> Claimed:
        # A connection of its own, one look-up at a time: the drains' pool stays theirs.
        async with self._looking:
            try:
                if self._connection is None or self._connection.is_closed():
                    self._connection = await asyncpg.connect(self.dsn)
                row = await self._connection.fetchrow(
                    "SELECT next_attempt_at, claimed_by FROM outbox_messages WHERE id = $1",
                    row_id,
                )
            except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
                # Unknown (the server is away): such a delivery is never held against a drain.
                return Claimed()
            if row is None:
                return Claimed()
            return Claimed(row["next_attempt_at"], row["claimed_by"])

    async def close(self) -> None:
        """Close the look-up connection."""
        if self._connection is not None:
            self._connection.terminate()


class CountingOutbox(Outbox):
    """An Outbox whose drains add what they report to a shared tally, and that knows
    how many drain passes are under way, so a run can wait for them to finish. Each
    pass (the drain job's and the wake-up's) is a DrainRun its receiver calls see."""

    def __init__(self, *args: object, tally: DrainReport, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.tally = tally
        self.passes = 0

    async def drain_on(self, connection: Any) -> DrainReport:
        """Drain as the Outbox does, as one DrainRun."""
        with _drain_run():
            return await super().drain_on(connection)

    async def drain_once(self) -> DrainReport:
        """Drain as the Outbox does, as one DrainRun; add the report to the tally."""
        self.passes += 1
        try:
            with _drain_run():
                report = await super().drain_once()
            for outcome in ("delivered", "retried", "stuck", "lost"):
                setattr(
                    self.tally, outcome, getattr(self.tally, outcome) + getattr(report, outcome)
                )
            return report
        finally:
            self.passes -= 1


@contextlib.contextmanager
def _drain_run() -> Iterator[None]:
    run = DrainRun()
    reset = _DRAIN_RUN.set(run)
    try:
        yield
    except BaseException:
        run.died = True
        raise
    finally:
        run.ended = True
        _DRAIN_RUN.reset(reset)
