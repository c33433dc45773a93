"""A sync body's thread, and who keeps its run true once the event loop is gone.

A thread cannot be cancelled, and the process lives as long as it runs: at exit Python
joins the executor's worker threads (and ``asyncio.run`` waits for them first). But
``asyncio.run`` cancels every task before it waits, the runner's thread watcher and its
lease renewal among them, so a body that outlives the shutdown grace would run on with
no lease: once the lease ran out another process would start the job beside it. So when
the watcher is cancelled while its thread still runs, it *hands the run over* to the
thread's side, where nothing needs the event loop:

- a daemon *lease keeper* thread renews the running lease at once and then every third
  of the lease (a failed renewal again within seconds, as the loop's keeper does), on
  the sync engine, until the body's thread ends;
- the body's own thread, right after the body, records the run's real outcome and
  clears the lease (after a timeout already recorded, it only clears the lease). The
  record is written before the thread ends, so the process cannot exit before it lands.

The lease thus holds exactly while the body runs in a living process: a kill -9 ends the
keeper with the body, and the lease runs out after LEASE_SECONDS. Observers are not told
of a run that ends after the event loop; its log line is ``job.finished_after_shutdown``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .retry import renewal_delay

__all__ = ["ThreadBody", "keep_lease"]

logger = logging.getLogger("app.scheduler")


class ThreadBody:
    """One sync body in its worker thread, as any thread sees it: whether it ended, what
    it raised, and who settles its run when the event loop no longer watches it."""

    def __init__(self, func: Callable[[], None]) -> None:
        self._func = func
        self._lock = threading.Lock()
        self.ended = threading.Event()
        self.raised: BaseException | None = None
        self._on_end: Callable[[BaseException | None], None] | None = None

    def run(self) -> None:
        """Run the body here, in its worker thread; then, if it was handed over, settle
        its run in this same thread. Raises what the body raised."""
        try:
            self._func()
        except BaseException as exc:
            self.raised = exc
            raise
        finally:
            with self._lock:
                self.ended.set()
                on_end = self._on_end
            if on_end is not None:
                on_end(self.raised)

    def hand_over(self, on_end: Callable[[BaseException | None], None]) -> bool:
        """Have ``on_end(raised)`` called in the body's thread once the body ends, as the
        event loop will not see it. False when the body has ended already: nothing will
        call ``on_end`` and the caller settles the run itself."""
        with self._lock:
            if self.ended.is_set():
                return False
            self._on_end = on_end
            return True


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
                'Could not renew the running lease of job "%s" (run %s); retrying',
                job_id,
                run_id,
                exc_info=True,
                extra={"action": "job.lease_renew_failed", "job_id": job_id},
            )
        else:
            failures = 0
            if not held:
                if until.is_set():
                    return  # the body ended and its outcome cleared the lease meanwhile
                logger.warning(
                    'Job "%s" (run %s) lost its running lease while its body runs; '
                    "another leader may start the job",
                    job_id,
                    run_id,
                    extra={"action": "job.lease_lost", "job_id": job_id},
                )
                return
        until.wait(renewal_delay(period, failures))
