"""The leader's job timer: one timer for every leader-only job of a leadership, and
its wake, which claims what is due and starts the bodies of what it claimed.

A wake claims every due slot and run-now request in one statement; slots that come
due within the claim lead are claimed ahead and committed just before their instant
(a prepared claim), so their bodies begin on time, back to back. The timer owns the
bodies it started and whether a prepared claim under way has begun to commit."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Set
from dataclasses import replace
from datetime import datetime, timedelta

from .ahead import CommitCost, collector_held_off
from .broken import BrokenJobs
from .claiming import Claim, Due
from .clock import Clock
from .config import SchedulerConfig
from .faults import database_answers
from .loop import run_loop
from .registry import JobSpec
from .rows import LeaderRows, fire_time
from .runner import Runner
from .setbacks import Setbacks
from .store import JobRow, JobStore, PreparedClaimDropped, PreparedCommit
from .tenure import Tenure

__all__ = ["JobTimer"]

logger = logging.getLogger("app.scheduler")


class JobTimer:
    """Fires one leadership's leader-only jobs (``run``). Its ``bodies`` are the
    bodies it started that still run; only it adds to them and cancels them."""

    def __init__(
        self,
        leader_jobs: list[JobSpec],
        rows: LeaderRows,
        *,
        tenure: Tenure,
        setbacks: Setbacks,
        runner: Runner,
        store: JobStore,
        broken: BrokenJobs,
        committing: CommitCost,
        clock: Clock,
        config: SchedulerConfig,
    ) -> None:
        self._specs = {spec.id: spec for spec in leader_jobs}
        self.rows = rows
        self._tenure = tenure
        self._setbacks = setbacks
        self._runner = runner
        self._store = store
        self._broken = broken
        self._committing = committing
        self._clock = clock
        self._config = config
        self._claim_ahead = timedelta(seconds=config.claim_ahead_seconds)
        self._bodies: set[asyncio.Task[None]] = set()

    @property
    def bodies(self) -> Set[asyncio.Task[None]]:
        """The bodies this timer started that still run (a live view: each leaves it as
        it ends)."""
        return self._bodies

    async def cancel_bodies(self) -> None:
        """Cancel every body still running and wait until each has ended."""
        for task in self._bodies:
            task.cancel()
        await asyncio.gather(*self._bodies, return_exceptions=True)
        self._bodies.clear()

    async def run(self) -> None:
        """Fire every leader-only job of this leadership from one timer: sleep until
        the soonest moment any job needs, then claim every slot and run-now request due
        by then in one claim and start their bodies. A row the tick's reload changed
        (a pause, a resume, a run now) is planned again at once. Never returns; a
        failed wake is logged and its jobs retried a tick later."""
        timetable = self.rows.timetable
        self.rows.plan_all(self._specs)

        async def step() -> float:
            # Cleared before the timetable is read: a change made after is not missed.
            timetable.changed.clear()
            due = timetable.pop_due(self._clock.now())
            if due:
                try:
                    await self._wake([self._specs[job_id] for job_id in due])
                except Exception:
                    logger.warning("scheduler: a timer wake failed", exc_info=True)
                    retry = self._clock.now() + timedelta(seconds=self._config.leader_tick_seconds)
                    for job_id in due:
                        if timetable.planned(job_id) is None:
                            timetable.plan(job_id, retry)
                return 0.0
            soonest = timetable.soonest()
            # With nothing planned (every job paused) it still parks on the clock, a
            # tick at a time, as every waiting part of a leader does.
            if soonest is None:
                return self._config.leader_tick_seconds
            return (soonest - self._clock.now()).total_seconds()

        await run_loop(step, self._clock, wakes=[timetable.changed.wait])

    async def _wake(self, specs: list[JobSpec]) -> None:
        """One wake of the timer: register the jobs that have no row, and claim every
        due slot or run-now request of the others in one claim; a slot that came due
        before the request is claimed first. Start the bodies of the claims that run,
        all before the next await, so that a demotion cannot fall between a claim and
        its start; a leadership already lost cancels them before they start (each is
        recorded cancelled). Plan each job's next step."""
        dues: list[Due] = []
        rows: dict[str, JobRow] = {}
        upcoming: list[tuple[datetime, JobSpec]] = []
        for spec in specs:
            if spec.id not in self.rows:
                await self._register_late(spec)
        now = self._clock.now()
        for spec in specs:
            row = self.rows.get(spec.id)
            if row is None or row.paused or not row.leader_only or spec.id in rows:
                continue
            rows[spec.id] = row
            fire_at = fire_time(spec, row.next_run_at)
            request = row.run_requested_at
            slot_first = (
                fire_at is not None and fire_at <= now and (request is None or fire_at <= request)
            )
            if request is not None and not slot_first:
                dues.append(Due(spec, request, manual=True))
            elif fire_at is not None and fire_at <= now:
                dues.append(Due(spec, row.next_run_at))
            elif fire_at is None or fire_at > now + self._claim_ahead:
                # Not due after all: its row changed since it was planned.
                self.rows.plan(spec.id)
            elif self._runner.is_running(spec.id) or _leased_at(row, fire_at):
                # A body of the job still runs, here or (its lease as last read says)
                # elsewhere, and may end before the slot: whether the slot runs or is
                # skipped is decided at the slot, not ahead of it.
                self.rows.plan_at(spec.id, fire_at)
            else:
                upcoming.append((fire_at, spec))
        prepared = self._prepare(upcoming, dues, rows, now)
        if not dues:
            return
        claiming = {due.spec.id for due in dues}
        self.rows.claiming(claiming)
        try:
            claims = await self._claim_to_its_answer(dues, prepared)
        finally:
            self.rows.claimed(claiming)
        starts_at = None if prepared is None else prepared.starts_at
        lost = self._tenure.lost.is_set()
        unmatched: dict[str, JobRow] = {}
        failed: list[tuple[str, Exception]] = []
        repaired: list[str] = []
        moved: list[str] = []
        # The bodies of a prepared claim begin together when the slot comes.
        gate = None if starts_at is None else asyncio.Event()
        gated: list[asyncio.Task[None]] = []
        with collector_held_off():
            for due, claim in zip(dues, claims, strict=True):
                spec, row = due.spec, rows[due.spec.id]
                if isinstance(claim, Exception):
                    failed.append((spec.id, claim))
                    continue
                if claim is None:
                    # Another process took it, the job was paused, or our key is gone.
                    self._setbacks.unmatched(spec.id)
                    unmatched[spec.id] = row
                    continue
                self._setbacks.row_claimed(spec.id)
                requested = None if claim.manual else row.run_requested_at
                self.rows.put(
                    spec.id, replace(row, next_run_at=claim.next_slot, run_requested_at=requested)
                )
                if claim.runs:
                    body = self._runner.start(spec, claim, gate=gate)
                    gated.append(body)
                    self._bodies.add(body)
                    body.add_done_callback(self._bodies.discard)
                    if lost:
                        body.cancel()
                if spec.id in self._broken:
                    repaired.append(spec.id)
                moved.append(spec.id)
            if prepared is not None:
                self._committing.learn(len(gated), prepared.began_at)
            if starts_at is not None and gate is not None and gated:
                try:
                    # Checked again after each sleep: a wall clock slewed or stepped
                    # back ends a sleep before the moment it was computed for.
                    while (ahead := (starts_at - self._clock.now()).total_seconds()) > 0:
                        await self._clock.sleep(ahead)
                except asyncio.CancelledError:
                    # A step-down before the slot: they never begin (recorded cancelled).
                    for body in gated:
                        body.cancel()
                    raise
                gate.set()
            # The bodies take their first step before the bookkeeping below (and before
            # the collector runs again): the last of a thousand that share a slot is
            # not kept waiting for it.
            await asyncio.sleep(0)
        changed = self.rows.changed_while_claimed(claiming)
        for job_id in moved:
            if job_id not in changed:
                self.rows.plan(job_id)
        await self.rows.read_again(self._store, unmatched, changed)
        for job_id, exc in failed:
            await self._setbacks.job_failed(job_id, exc)
        if repaired:
            await self._broken.repaired(repaired)

    def _prepare(
        self,
        upcoming: list[tuple[datetime, JobSpec]],
        dues: list[Due],
        rows: dict[str, JobRow],
        now: datetime,
    ) -> PreparedCommit | None:
        """Of the slots that come due within the claim lead, add to ``dues`` those of the
        soonest instant, to be claimed now and committed then; the others are planned for
        the next wake. None, and nothing added, when ``dues`` holds slots due already:
        they are claimed at once, and the upcoming ones by the next wake."""
        if not upcoming:
            return None
        if dues:
            for _, spec in upcoming:
                self.rows.plan_at(spec.id, now)
            return None
        starts_at = min(at for at, _ in upcoming)
        for at, spec in upcoming:
            if at == starts_at:
                dues.append(Due(spec, rows[spec.id].next_run_at))
            else:
                self.rows.plan_at(spec.id, now)
        # Committed just early enough that its bodies are started, each waiting for the
        # slot, by the slot: then they all begin on time, back to back.
        commit_at = starts_at - self._committing.margin(len(dues), self._claim_ahead / 2)
        # A leadership lost by the commit drops it (rolled back: the next leader runs
        # its slots).
        return PreparedCommit(
            starts_at,
            commit_at,
            self._clock,
            (commit_at - now).total_seconds(),
            dropped=self._tenure.lost,
        )

    async def _claim_to_its_answer(
        self, dues: list[Due], prepared: PreparedCommit | None
    ) -> list[Claim | Exception | None]:
        """_claim(), carried to its answer when the step-down cancels the timer meanwhile:
        a claim that committed just then has runs that no body will serve. They are
        started and cancelled at once, so each is recorded cancelled rather than left
        'running' until its lease runs out; then the cancel goes on. The answer is
        awaited for a leader tick at most: a statement that hangs (a partition) must not
        hold up the step-down, and its runs are then left to their lease. A prepared
        claim that has not begun to commit is rolled back at once instead: the next
        leader runs its slots."""
        claiming = asyncio.ensure_future(self._claim(dues, prepared))
        try:
            return await asyncio.shield(claiming)
        except asyncio.CancelledError:
            if prepared is not None and not prepared.committing.is_set():
                claiming.cancel()
                await asyncio.wait({claiming})
                raise
            try:
                await asyncio.wait({claiming}, timeout=self._config.leader_tick_seconds)
            finally:
                claiming.cancel()
            if claiming.done() and not claiming.cancelled() and claiming.exception() is None:
                for due, claim in zip(dues, claiming.result(), strict=True):
                    if isinstance(claim, Claim) and claim.runs:
                        self._runner.start(due.spec, claim).cancel()
            raise

    async def _claim(
        self, dues: list[Due], prepared: PreparedCommit | None = None
    ) -> list[Claim | Exception | None]:
        """runner.claim_many(), and each job's failure in its place: when the claim of
        several fails while the database answers, each is claimed alone, so that the
        job whose row refuses the claim is told from the others. A prepared claim
        dropped for a lost leadership claimed nothing (None each)."""
        try:
            return await self._runner.claim_many(dues, self._tenure.fence, prepared)
        except PreparedClaimDropped:
            return [None] * len(dues)
        except Exception as exc:
            # While the database answers, one job's row (bad, or busy past a timeout)
            # must not hold up the others.
            if len(dues) == 1 or not await database_answers(self._store.engine, exc):
                return [exc] * len(dues)
            logger.warning(
                "scheduler.claim_one_by_one: the claim of %s jobs failed (%s); claiming each alone",
                len(dues),
                exc.__class__.__name__,
                extra={"action": "scheduler.claim_one_by_one", "pid": os.getpid()},
            )
        claims: list[Claim | Exception | None] = []
        for due in dues:
            try:
                claims += await self._runner.claim_many([due], self._tenure.fence, prepared)
            except PreparedClaimDropped:
                claims.append(None)
            except Exception as exc:
                claims.append(exc)
        return claims

    async def _register_late(self, spec: JobSpec) -> None:
        """Register the row of a job the promotion could not register."""
        try:
            row = await self._store.register_leader_job(spec, self._clock.now(), self._config.zone)
        except Exception as exc:
            await self._setbacks.job_failed(spec.id, exc)
            return
        self.rows.put(spec.id, row)
        await self._broken.repaired([spec.id])
        self.rows.plan(spec.id)


def _leased_at(row: JobRow, moment: datetime) -> bool:
    """Whether the row, as last read, has a running lease that lasts to ``moment``."""
    return row.running_until is not None and row.running_until >= moment
