"""Group commits of what many runs of one process write at once: their outcomes and
their running-lease renewals.

A thousand jobs on one cron minute end together and hold their leases together. One
write per run would queue a thousand transactions behind the connection pool (an
outcome that waits out its record timeout is lost, and its run reads 'running' until
its lease runs out), and one renewal task per run would send a thousand statements
every third of the lease. Here the outcomes go in as few commits as the database allows
(the first at once, those that come meanwhile together in the next), and every lease
of the process is renewed by one statement.
"""

from __future__ import annotations

import asyncio
import logging

from .carried import Carried
from .clock import Clock
from .loop import Stop, run_loop
from .retry import renewal_delay
from .start_window import StartWindow
from .store import JobStore
from .store.leases import HeldLease
from .store.runs import Outcome

__all__ = ["LeaseKeeper", "OutcomeWriter"]

logger = logging.getLogger("app.scheduler")

_Waiting = tuple[Outcome, "asyncio.Future[None]"]


class OutcomeWriter:
    """Writes run outcomes as group commits: an outcome given while no write is under
    way is written at once; those given meanwhile wait for it and go together in the
    next write (at most ``batch_size``, one per job). A write of several that fails is
    tried again an outcome at a time, so an outcome the database refuses fails alone."""

    def __init__(self, store: JobStore, *, batch_size: int = 500) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size!r}")
        self.store = store
        self.batch_size = batch_size
        self._waiting: list[_Waiting] = []
        self._writer: asyncio.Task[None] | None = None

    async def write(self, outcome: Outcome) -> None:
        """Return once ``outcome`` is committed; raise what its write raised (nothing
        of it is recorded then)."""
        written: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((outcome, written))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_waiting(), name="run-outcomes")
        await written

    async def _write_waiting(self) -> None:
        batch: list[_Waiting] = []
        try:
            while self._waiting:
                batch = self._take()
                await self._commit(batch)
            batch = []
        finally:
            # Cancelled (the event loop ends): no one is left to write what waits.
            stranded, self._waiting = batch + self._waiting, []
            _settle(stranded, RuntimeError("the outcome writer stopped before this write"))

    def _take(self) -> list[_Waiting]:
        batch: list[_Waiting] = []
        jobs: set[str] = set()
        rest: list[_Waiting] = []
        for entry in self._waiting:
            outcome, written = entry
            if written.done():
                continue  # its writer gave up on it (cancelled)
            if outcome.job_id in jobs or len(batch) == self.batch_size:
                rest.append(entry)
                continue
            jobs.add(outcome.job_id)
            batch.append(entry)
        self._waiting = rest
        return batch

    async def _commit(self, batch: list[_Waiting]) -> None:
        try:
            await self.store.finish_many([outcome for outcome, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                _settle(batch, exc)
                return
            for entry in batch:
                if entry[1].done():
                    continue  # its writer gave up on it meanwhile
                try:
                    await self.store.finish_many([entry[0]])
                except Exception as alone:
                    _settle([entry], alone)
                else:
                    _settle([entry], None)
            return
        _settle(batch, None)


def _settle(entries: list[_Waiting], exc: BaseException | None) -> None:
    for _, written in entries:
        if written.done():
            continue
        if exc is None:
            written.set_result(None)
        else:
            written.set_exception(exc)


class LeaseKeeper:
    """Renews the running lease of every run this process holds one for (job bodies and service
    copies) in one commit (JobStore.renew_leases) every third of the lease, counted from
    the start of the last renewal on the clock's monotonic time (a wall clock stepped
    back mid-round would otherwise put off the next renewal by the step). A renewal of
    several that fails is tried again a lease at a time at once, so a lease whose row is
    locked or refused fails alone; a lease that failed is tried again within seconds
    (retry.renewal_delay). An attempt that does not finish within a third of the lease
    counts as failed. A run found to have lost its lease is logged and no longer
    renewed. A lease held a period or more after its run took it (a body that started
    late) is renewed at once, alone. While a job run's lease is held here, this
    process's reaps leave it alone (``renewing``, which the runner gives every reap):
    its body runs here. A service copy's lease is never reaped: a lease that ran out is
    simply taken by the next copy."""

    def __init__(
        self, store: JobStore, *, clock: Clock, lease_seconds: float, carried: Carried
    ) -> None:
        self.store = store
        self._carried = carried
        self.clock = clock
        self.lease_seconds = lease_seconds
        self._held: dict[int, HeldLease] = {}
        self._renewer: asyncio.Task[None] | None = None
        # One-off renewals of leases held too late for the renewer's next round.
        self._overdue: set[asyncio.Task[bool]] = set()

    def hold(self, lease: HeldLease, *, taken_at: float | None = None) -> None:
        """Renew ``lease`` from now on, until drop(). ``taken_at``: when its run took it,
        on this process's monotonic clock (Clock.monotonic); one taken a renewal period
        or more ago (its body started late after its claim: a process that froze, a
        clock that jumped) is renewed at once, since its next renewal would come too
        late."""
        self._held[lease.run_id] = lease
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.create_task(self._renew(), name="running-leases")
        period = self.lease_seconds / 3
        if taken_at is not None and self.clock.monotonic() - taken_at >= period:
            renewal = asyncio.create_task(self._round([lease], period), name="running-lease")
            self._overdue.add(renewal)
            renewal.add_done_callback(self._overdue.discard)

    def start_window(self, taken_at: float) -> StartWindow:
        """When a body whose claim took its lease at ``taken_at`` (Clock.monotonic, read
        before the claim) may still begin: until a renewal period before the lease runs
        out, so that the renewal hold() then makes at once lands while the lease holds.
        A body that would begin later never does: its lease may have been reaped and
        the job started elsewhere."""
        return StartWindow(taken_at, self.lease_seconds - self.lease_seconds / 3)

    def drop(self, run_id: int) -> None:
        """Stop renewing the lease of run ``run_id`` (its body ended)."""
        self._held.pop(run_id, None)

    @property
    def renewing(self) -> frozenset[int]:
        """The runs whose job or run lease is renewed here now: no reap of this
        process takes them, whatever the lease clock says (a service copy's lease is
        never reaped)."""
        return frozenset(run_id for run_id, lease in self._held.items() if lease.kind != "service")

    async def _renew(self) -> None:
        period = self.lease_seconds / 3
        failures = 0
        began = self.clock.monotonic()

        def until_next() -> float:
            # Counted from the start of the last round, on the monotonic clock.
            return max(0.0, renewal_delay(period, failures) - (self.clock.monotonic() - began))

        async def renewal_round() -> float | Stop[None]:
            nonlocal failures, began
            if not self._held:
                return Stop(None)
            began = self.clock.monotonic()
            failed = await self._round(list(self._held.values()), period)
            failures = failures + 1 if failed else 0
            return until_next()

        await run_loop(renewal_round, self.clock, first_delay=until_next())

    async def _round(self, leases: list[HeldLease], period: float) -> bool:
        """Renew ``leases``; log and drop those found lost. True when any renewal failed."""
        renewed, failed, error = await self._renew_each(leases, period)
        if failed:
            logger.warning(
                "Could not renew the running leases of %s run(s) (jobs %s); retrying",
                len(failed),
                ", ".join(sorted({lease.job_id for lease in failed})[:5]),
                exc_info=error,
                extra={"action": "job.lease_renew_failed"},
            )
        for lease in leases:
            if lease in failed or lease.run_id in renewed or lease.run_id not in self._held:
                continue
            logger.warning(
                '"%s" (run %s) lost its running lease while its work runs; '
                "another leader may start it",
                lease.job_id,
                lease.run_id,
                extra={"action": "job.lease_lost", "job_id": lease.job_id},
            )
            self.drop(lease.run_id)
        return bool(failed)

    async def _renew_each(
        self, leases: list[HeldLease], period: float
    ) -> tuple[set[int], list[HeldLease], Exception | None]:
        """Renew ``leases`` in one statement, else each alone: the ids of the runs that
        still hold theirs, the leases whose renewal failed, and the last failure."""
        try:
            return await self._attempt(leases, period), [], None
        except Exception as exc:
            if len(leases) == 1:
                return set(), leases, exc
            logger.debug("a renewal of %s leases failed", len(leases), exc_info=True)
        renewed: set[int] = set()
        failed: list[HeldLease] = []
        error: Exception | None = None
        for lease in leases:
            try:
                renewed |= await self._attempt([lease], period)
            except Exception as exc:
                failed.append(lease)
                error = exc
        return renewed, failed, error

    async def _attempt(self, leases: list[HeldLease], period: float) -> set[int]:
        # Carried: a statement cut off mid-way would lose its connection; it completes
        # (or fails on its row-lock patience) in the background as the next one goes.
        renewal = self._carried.spawn(self.store.renew_leases(leases, self.lease_seconds))
        async with asyncio.timeout(period):
            return await asyncio.shield(renewal)
