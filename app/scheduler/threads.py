"""The threads a run started, and who keeps its run true once the event loop is gone.

A thread cannot be cancelled. A run (a job body, a service copy) may leave threads
running after its task was cancelled (a step-down, a shutdown) or its body ended: a
sync body's own thread, and the threads an async body or a service started through the
loop's default executor (``asyncio.to_thread``, ``loop.run_in_executor(None, ...)``).
The run's running lease holds until every one of them ended, or another leader would
start the same work beside them. So each run keeps a ``RunThreads``:

- The scheduler makes the loop's default executor an ``OwningExecutor`` (a
  ThreadPoolExecutor of the default size) when the first run starts on that loop
  (``owning_executor``). ``loop.run_in_executor`` submits to it from inside the calling
  task's context, so a submission made within the run's ``owning()`` block, by its task
  or by a task or callback started from there (they copy its context), is one of the
  run's threads. Threads started otherwise (``threading.Thread``, another executor,
  anyio's worker threads, or after the app set a default executor of its own) are not
  seen, and hold nothing.
- A task started inside that block (``asyncio.create_task`` by the run's task or by a
  task it started) is the run's work too, counted as one of its threads until it ends:
  the scheduler also sets the loop's task factory (``owning_executor``, wrapping one the
  app set). So a task a body leaves behind, and every thread that task starts later,
  holds the run's lease, though the body returned. Tasks started otherwise (before the
  run, or from another task's context) are not the run's.
- ``close()`` says the run's own part (its task) ended; ``has_ended`` is true (and the
  ``ended`` Event a thread waits on set) once it did and none of its threads (or tasks)
  runs.

``asyncio.run`` cancels every task before it waits for the executor's threads, the
runner's lease renewal and its watch over the threads among them. So when that watch
is cancelled while a thread still runs, the run is *handed over* to the threads' side,
where nothing needs the event loop:

- a daemon *lease keeper* thread renews the running lease at once and then every third
  of the lease (a failed renewal again within seconds, as the loop's keeper does), on
  the sync engine, until the run's threads ended;
- the run's last thread, as it ends, settles the run (records its outcome, or releases
  its lease) in a callback of its future, which runs in that thread before the executor
  lets it go: the process cannot exit before the record lands.

The lease thus holds exactly while the run's work runs in a living process: a kill -9
ends the keeper with the threads, and the lease runs out after LEASE_SECONDS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar, Token
from typing import Any, ParamSpec, TypeVar

from .retry import renewal_delay

__all__ = ["OwningExecutor", "RunThreads", "keep_lease", "owning_executor"]

logger = logging.getLogger("app.scheduler")

P = ParamSpec("P")
T = TypeVar("T")

# The run whose owning() block the current context is in.
_OWNER: ContextVar[RunThreads | None] = ContextVar("regent_run_threads", default=None)
# Each event loop's OwningExecutor, set as its default executor.
_EXECUTORS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, OwningExecutor] = (
    weakref.WeakKeyDictionary()
)


class OwningExecutor(ThreadPoolExecutor):
    """A ThreadPoolExecutor that counts each submission made inside a run's ``owning()``
    block as one of that run's threads (see RunThreads)."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        """ThreadPoolExecutor.submit; the future joins the current run's threads."""
        future = super().submit(fn, *args, **kwargs)
        owner = _OWNER.get()
        if owner is not None:
            owner.add(future)
        return future


def owning_executor(loop: asyncio.AbstractEventLoop) -> OwningExecutor:
    """``loop``'s OwningExecutor, made its default executor on the first call for it,
    and its task factory made one that counts a task started inside a run's
    ``owning()`` block as that run's (wrapping the factory the loop had). An executor
    the loop had is left to finish what it runs (its idle threads exit once it is
    collected)."""
    executor = _EXECUTORS.get(loop)
    if executor is None:
        executor = OwningExecutor(thread_name_prefix="asyncio")
        loop.set_default_executor(executor)
        loop.set_task_factory(_owning_task_factory(loop.get_task_factory()))
        _EXECUTORS[loop] = executor
    return executor


def _owning_task_factory(previous: Any) -> Any:
    """A task factory that makes tasks as ``previous`` (or asyncio.Task) does, then
    adds each one started in a run's owning() context to that run's threads."""

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future[Any]:
        if previous is None:
            task: asyncio.Future[Any] = asyncio.Task(coro, loop=loop, **kwargs)
        else:
            task = previous(loop, coro, **kwargs)
        context = kwargs.get("context")
        owner = _OWNER.get() if context is None else context.get(_OWNER)
        if owner is not None:
            owner.add(task)
        return task

    return factory


class RunThreads:
    """The executor threads of one run, as any thread sees them: whether the run and
    its threads ended, and who settles the run when the event loop no longer watches."""

    # Made per run, a thousand at once on a thundering slot: what only an outliving
    # run needs (the waiters, the Event a keeper thread waits on) is made when needed.
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[Future[Any] | asyncio.Future[Any]] = set()
        self._closed = False
        self._ended = False
        self._ended_event: threading.Event | None = None
        self._on_end: Callable[[], None] | None = None
        # (loop, future) of every wait() in progress, resolved when no thread runs.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def owning(self) -> _Owning:
        """A block within which what the running task (and every task or callback it
        starts meanwhile) submits to the loop's default executor is one of this run's
        threads; the executor is made an OwningExecutor on entering it."""
        return _Owning(self)

    @property
    def has_ended(self) -> bool:
        """True once the run was closed and none of its threads (or tasks) runs."""
        return self._ended

    @property
    def ended(self) -> threading.Event:
        """An Event set once the run has ended (has_ended), for a thread to wait on."""
        with self._lock:
            if self._ended_event is None:
                self._ended_event = threading.Event()
                if self._ended:
                    self._ended_event.set()
            return self._ended_event

    @property
    def running(self) -> bool:
        """True while a thread of this run runs (or waits in the executor's queue)."""
        with self._lock:
            return bool(self._running)

    def add(self, future: Future[Any] | asyncio.Future[Any]) -> None:
        """Count ``future``'s thread (or task) as one of this run's until it is done. A
        thread started after the run ended holds nothing: its lease is gone."""
        with self._lock:
            if self._ended:
                return
            self._running.add(future)
        future.add_done_callback(self._thread_ended)

    def close(self) -> None:
        """The run's own part ended: it has ended once none of its threads runs."""
        with self._lock:
            self._closed = True
        self._settle_if_done()

    async def wait(self) -> None:
        """Return once no thread of this run runs; after close(), once it ended. A
        cancelled wait leaves the threads alone."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._running:
                return
            waiter = loop.create_future()
            self._waiters.append((loop, waiter))
        await waiter

    def hand_over(self, on_end: Callable[[], None]) -> bool:
        """After close(): have ``on_end()`` called in the run's last thread as it ends,
        since the event loop will not see it. False when the run has ended already:
        nothing will call ``on_end`` and the caller settles the run itself."""
        with self._lock:
            if self._ended:
                return False
            self._on_end = on_end
            return True

    def _thread_ended(self, future: Future[Any] | asyncio.Future[Any]) -> None:
        # In the thread that ran it (or in the loop's: a task's, a future cancelled queued).
        with self._lock:
            self._running.discard(future)
        self._settle_if_done()

    def _settle_if_done(self) -> None:
        with self._lock:
            if self._running:
                return
            waiters, self._waiters = self._waiters, []
            on_end = None
            if self._closed and not self._ended:
                self._ended = True
                if self._ended_event is not None:
                    self._ended_event.set()
                on_end = self._on_end
        for loop, waiter in waiters:
            # A loop already closed has no one waiting any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_resolve, waiter)
        if on_end is not None:
            on_end()


class _Owning:
    """RunThreads.owning()'s block (a class, not a generator: one is entered per run)."""

    __slots__ = ("_threads", "_token")

    def __init__(self, threads: RunThreads) -> None:
        self._threads = threads
        self._token: Token[RunThreads | None] | None = None

    def __enter__(self) -> None:
        owning_executor(asyncio.get_running_loop())
        self._token = _OWNER.set(self._threads)

    def __exit__(self, *exc_info: object) -> None:
        assert self._token is not None
        _OWNER.reset(self._token)


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def keep_lease(
    renew: Callable[[], bool], *, period: float, until: threading.Event, job_id: str, run_id: int
) -> threading.Thread:
    """Start a daemon thread that calls ``renew()`` now and every ``period`` seconds
    until ``until`` is set or ``renew()`` returns False (the run lost its lease). A
    failed renewal is logged and retried after retry.renewal_delay's short backoff."""
    keeper = threading.Thread(
        target=_keep,
        args=(renew, period, until, job_id, run_id),
        name=f"running-lease:{job_id}",
        daemon=True,
    )
    keeper.start()
    return keeper


def _keep(
    renew: Callable[[], bool], period: float, until: threading.Event, job_id: str, run_id: int
) -> None:
    failures = 0
    while not until.is_set():
        try:
            held = renew()
        except Exception:
            failures += 1
            logger.warning(
                'Could not renew the running lease of "%s" (run %s); retrying',
                job_id,
                run_id,
                exc_info=True,
                extra={"action": "job.lease_renew_failed", "job_id": job_id},
            )
        else:
            failures = 0
            if not held:
                if until.is_set():
                    return  # the run ended and its settling cleared the lease meanwhile
                logger.warning(
                    '"%s" (run %s) lost its running lease while its work runs; '
                    "another leader may start it",
                    job_id,
                    run_id,
                    extra={"action": "job.lease_lost", "job_id": job_id},
                )
                return
        until.wait(renewal_delay(period, failures))
