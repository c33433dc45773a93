"""A claimed body's run: an async body on the event loop, a sync body in a worker
thread (never on the loop), its sessions opened lazily, committed when it returns and
always closed; its lease held while it or any thread it started runs; its outcome
recorded (recording.py) and, when threads outlive it, outlasted (outlast.py)."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from zoneinfo import ZoneInfo

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import Session, sessionmaker

from .batching import LeaseKeeper
from .claiming import Claim
from .clock import Clock
from .context import JobContext, job_log
from .errors import SchedulerError
from .outlast import Outlast, Outliving
from .recording import Recorder, Run
from .registry import JobSpec
from .store import HeldLease, format_error
from .threads import RunThreads, owning_executor

__all__ = ["Bodies"]

logger = logging.getLogger("app.scheduler")

_CANCELLED = "cancelled: this worker stopped leading or shut down"


def _run_in_thread(func: Callable[[JobContext], Any], ctx: JobContext) -> None:
    try:
        result = func(ctx)
        if inspect.isawaitable(result):
            # A plain def that returns a coroutine never ran its body: not a success.
            if inspect.iscoroutine(result):
                result.close()
            raise SchedulerError(
                f'job "{ctx.job_id}" is a plain def that returned {type(result).__name__}, '
                "so its body never ran; declare it `async def`"
            )
        ctx.commit_sync()
    finally:
        ctx.close_sync()


def _body_in_thread(run: Run, func: Callable[[JobContext], Any], ctx: JobContext) -> None:
    """A sync body in its worker thread; what it raised is kept on its run."""
    try:
        _run_in_thread(func, ctx)
    except BaseException as exc:
        run.raised = exc


class Bodies:
    """Runs the bodies of one process's claimed slots. It owns what is alive while each
    job's body runs (``alive``): the run's task until the body starts, then a future
    of the body (async) or the task watching its thread."""

    def __init__(
        self,
        *,
        pid: int,
        schedule: str,
        clock: Clock,
        zone: ZoneInfo,
        sessions: async_sessionmaker[AsyncSession],
        sync_sessions: sessionmaker[Session],
        leases: LeaseKeeper,
        recorder: Recorder,
        outlast: Outlast,
    ) -> None:
        self._pid = pid
        self._schedule = schedule
        self._clock = clock
        self._zone = zone
        self._sessions = sessions
        self._sync_sessions = sync_sessions
        self._leases = leases
        self._recorder = recorder
        self._outlast = outlast
        self._alive: dict[str, asyncio.Future[Any]] = {}

    def alive(self, job_id: str, future: asyncio.Future[Any]) -> None:
        """``future`` is what is alive of the job's run from now on (a run's task
        until its body starts)."""
        self._alive[job_id] = future

    def is_running(self, job_id: str) -> bool:
        """True while a body of the job runs in this process (a thread may outlive the
        run's task and this worker's leadership)."""
        alive = self._alive.get(job_id)
        return alive is not None and not alive.done()

    @property
    def running_job_ids(self) -> set[str]:
        """Ids of the jobs whose body runs in this process now, whoever leads."""
        return {job_id for job_id, alive in self._alive.items() if not alive.done()}

    @property
    def pending(self) -> list[asyncio.Future[Any]]:
        """What is alive of every body still running."""
        return [alive for alive in self._alive.values() if not alive.done()]

    async def execute(self, spec: JobSpec, claim: Claim) -> None:
        """Run the body of a claimed slot and record how it ended. Never raises but
        CancelledError: an async body is then recorded ``cancelled``; a thread runs on and
        its outcome is recorded (and logged) when it ends. The run's lease holds while
        its body or any thread it started (RunThreads) runs."""
        pid, slot = self._pid, claim.slot
        log = job_log(spec, pid)
        if self._past_its_lease(claim):
            await self._never_started(spec, claim, log)
            return
        logger.info(
            'Running job "%s" (id=%s, slot=%s, pid=%s)',
            spec.name,
            spec.id,
            slot.isoformat(),
            pid,
            extra={"action": "job.running", "job_id": spec.id, "pid": pid},
        )
        ctx = JobContext(
            job_id=spec.id,
            name=spec.name,
            scheduled_at=slot,
            clock=self._clock,
            log=log,
            zone=self._zone,
            term=claim.term,
            schedule=self._schedule,
            _sessions=self._sessions if spec.is_async else None,
            _sync_sessions=None if spec.is_async else self._sync_sessions,
        )
        lateness = self._clock.now() - slot - timedelta(seconds=claim.jitter)
        run = Run(spec, claim, log, time.perf_counter(), lateness)
        if spec.is_async:
            await self._run_async(run, ctx)
            return
        threads = RunThreads()
        body = functools.partial(_body_in_thread, run, spec.func, ctx)
        context = contextvars.copy_context()
        loop = asyncio.get_running_loop()
        # An executor future, not a task (as asyncio.to_thread would make): the loop's
        # end cancels tasks, and a body queued behind busy workers must still run, and
        # be recorded, once submitted.
        with threads.owning():
            owning_executor(loop).submit(context.run, body)
        threads.close()
        watcher = asyncio.ensure_future(self._watch_thread(run, threads))
        self._alive[spec.id] = watcher
        try:
            await asyncio.shield(watcher)
        except asyncio.CancelledError:
            if not watcher.done():
                run.detached = True
                logger.warning(
                    'Job "%s" runs on in its thread after its run was cancelled (this worker '
                    "stopped leading or shuts down); its running lease is renewed and its "
                    "outcome recorded when it ends",
                    spec.name,
                    extra={"action": "job.outlived_leadership", "job_id": spec.id, "pid": pid},
                )
            raise

    def _past_its_lease(self, claim: Claim) -> bool:
        """True when the claim's running lease may have run out before its body began
        (LeaseKeeper.start_window): another leader may already run the job."""
        return (
            claim.leased
            and claim.leased_at is not None
            and self._leases.start_window(claim.leased_at).closed(self._clock)
        )

    async def _never_started(
        self, spec: JobSpec, claim: Claim, log: logging.LoggerAdapter[logging.Logger]
    ) -> None:
        """Record a claimed slot whose body began too late as 'missed', letting its
        lease go: the body never runs."""
        assert claim.leased_at is not None
        late = self._clock.monotonic() - claim.leased_at
        error = (
            f"not run: its body could begin only {late:.1f} s after its claim took its "
            "running lease (this process or its clock stood still meanwhile), when the "
            "lease might have run out and another leader started the job"
        )
        logger.warning(
            'Job "%s" not started: its running lease might have run out (id=%s, slot=%s, '
            "run=%s, pid=%s, %.1f s after its claim)",
            spec.name,
            spec.id,
            claim.slot.isoformat(),
            claim.run_id,
            self._pid,
            late,
            extra={"action": "job.start_too_late", "job_id": spec.id, "pid": self._pid},
        )
        lateness = self._clock.now() - claim.slot - timedelta(seconds=claim.jitter)
        await self._recorder.finish(
            Run(spec, claim, log, time.perf_counter(), lateness), "missed", error
        )

    async def _run_async(self, run: Run, ctx: JobContext) -> None:
        spec = run.spec
        alive: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._alive[spec.id] = alive
        self._hold_lease(run)
        threads = RunThreads()
        outlived = False
        try:
            status, error = "ok", None
            try:
                try:
                    with threads.owning():
                        async with asyncio.timeout(spec.timeout) as deadline:
                            await spec.func(ctx)
                            await ctx.commit()
                except TimeoutError:
                    if not deadline.expired():
                        raise
                    status, error = "timeout", f"cancelled after timeout={spec.timeout:g} s"
                finally:
                    await ctx.aclose()
            except asyncio.CancelledError:
                outlived = self._outlived_by_threads(run, threads, "cancelled", _CANCELLED)
                await self._recorder.finish(run, "cancelled", _CANCELLED, body_ended=not outlived)
                raise
            except Exception as exc:
                status, error = "error", format_error(exc)
                run.log.exception('Job "%s" raised', spec.name, extra={"action": "job.error"})
            outlived = self._outlived_by_threads(run, threads, status, error)
            await self._recorder.finish(run, status, error, body_ended=not outlived)
            if status == "timeout":
                run.log.warning(
                    'Job "%s" timed out: %s', spec.name, error, extra={"action": "job.timeout"}
                )
        finally:
            if not outlived:
                self._leases.drop(run.claim.run_id)
            alive.set_result(None)

    def _outlived_by_threads(
        self, run: Run, threads: RunThreads, status: str, error: str | None
    ) -> bool:
        """An async body ended (``status``): True when threads or tasks it started run
        on (RunThreads). Its
        outcome is then recorded without clearing its lease, and the job stays busy
        here, its lease renewed, until they end (then the lease is released)."""
        threads.close()
        if threads.has_ended:
            return False
        run.recorded = (status, error)
        watcher = asyncio.ensure_future(self._outlast.outlast(self._job_outliving(run), threads))
        self._alive[run.spec.id] = watcher
        logger.warning(
            'Job "%s" ended (%s) while work it started (threads, or tasks it left '
            "behind) runs on; its running lease is renewed until that ends, and the job's "
            "next slots are skipped until then",
            run.spec.name,
            status,
            extra={
                "action": "job.outlived_by_threads",
                "job_id": run.spec.id,
                "pid": self._pid,
            },
        )
        return True

    async def _watch_thread(self, run: Run, threads: RunThreads) -> None:
        """Wait for a sync body's thread and record its outcome, however long it runs
        (its timeout recorded meanwhile); hand the run over to the thread's side if the
        event loop goes away first."""
        self._hold_lease(run)
        await self._outlast.outlast(
            self._job_outliving(run),
            threads,
            timeout=run.spec.timeout,
            on_timeout=functools.partial(self._record_timeout, run),
        )

    def _job_outliving(self, run: Run) -> Outliving:
        lease = (
            HeldLease(run.spec.id, run.claim.run_id, "run" if run.claim.replica else "job")
            if run.claim.leased
            else None
        )
        return Outliving(
            "job",
            run.spec.id,
            run.spec.name,
            lease,
            functools.partial(self._recorder.settle, run),
            functools.partial(self._recorder.settle_in_thread, run),
        )

    async def _record_timeout(self, run: Run) -> None:
        """A sync body outlasted its timeout: record it, keeping the lease (the job stays
        busy until the thread ends)."""
        spec = run.spec
        run.recorded = (
            "timeout",
            f"still running after timeout={spec.timeout:g} s "
            "(a thread cannot be cancelled; the next run waits for it)",
        )
        await self._recorder.finish(run, *run.recorded, body_ended=False)
        run.log.warning(
            'Job "%s" timed out: %s', spec.name, run.recorded[1], extra={"action": "job.timeout"}
        )

    def _hold_lease(self, run: Run) -> None:
        # Renewed with every other lease of this process while the body runs here.
        if run.claim.leased:
            self._leases.hold(
                HeldLease(run.spec.id, run.claim.run_id, "run" if run.claim.replica else "job"),
                taken_at=run.claim.leased_at,
            )
