"""The one rule for work that outlives its cancellation: a run (a job's body, a service
copy) whose threads run on after its task ended keeps its lease renewed until they
end, then is settled; if the event loop ends first, it is handed over to its threads'
side (threads.py), where a keeper thread renews the lease and its last thread settles
it."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .batching import LeaseKeeper
from .store import HeldLease, ThreadStore
from .threads import RunThreads, keep_lease

__all__ = ["Outlast", "Outliving"]

logger = logging.getLogger("app.scheduler")


@dataclass(frozen=True)
class Outliving:
    """A run (``kind`` "job" or "service", ``id``, ``name``) whose lease holds until
    its threads end: the lease (None: it holds none), and how it is settled on the loop
    (``settle()``) and from its last thread once the loop is gone
    (``settle_in_thread()``)."""

    kind: str
    id: str
    name: str
    lease: HeldLease | None
    settle: Callable[[], Awaitable[None]]
    settle_in_thread: Callable[[], None]


class Outlast:
    """Outlasts the runs of one process; ``leases`` renews their leases on the loop."""

    def __init__(
        self, leases: LeaseKeeper, thread_store: ThreadStore, *, lease_seconds: float, pid: int
    ) -> None:
        self._leases = leases
        self._thread_store = thread_store
        self._lease_seconds = lease_seconds
        self._pid = pid

    async def outlast(
        self,
        outliving: Outliving,
        threads: RunThreads,
        *,
        timeout: float | None = None,
        on_timeout: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """The one rule for work that outlives its cancellation: keep the run's lease
        renewed until its own part and every thread of it ended (``threads``, closed),
        then settle it on the loop (record its outcome, or release its lease). With
        ``timeout``, ``on_timeout()`` runs once that many seconds passed first. If the
        event loop ends meanwhile (asyncio.run cancels every task before it waits for
        the executor's threads), the run is handed over to its threads' side."""
        try:
            try:
                if timeout is not None and on_timeout is not None:
                    try:
                        async with asyncio.timeout(timeout):
                            await threads.wait()
                    except TimeoutError:
                        await on_timeout()
                await threads.wait()
            except asyncio.CancelledError:
                if not self._hand_over(outliving, threads):
                    await outliving.settle()
                raise
            await outliving.settle()
        finally:
            if outliving.lease is not None:
                self._leases.drop(outliving.lease.run_id)

    def _hand_over(self, outliving: Outliving, threads: RunThreads) -> bool:
        """Leave a run whose threads still run to the threads' side (see threads.py): a
        keeper thread renews its lease and its last thread settles it. False when they
        have ended already, for the loop to settle it."""
        if not threads.hand_over(outliving.settle_in_thread):
            return False
        lease = outliving.lease
        if lease is not None:
            keep_lease(
                functools.partial(self._thread_store.renew_lease, lease, self._lease_seconds),
                period=self._lease_seconds / 3,
                until=threads.ended,
                job_id=lease.job_id,
                run_id=lease.run_id,
            )
        kind = outliving.kind
        logger.warning(
            '%s "%s" runs on in its threads as the event loop ends (shutdown); its running '
            "lease is renewed from a thread and its last thread settles it when it ends",
            kind.capitalize(),
            outliving.name,
            extra={
                "action": f"{kind}.outlived_event_loop",
                f"{kind}_id": outliving.id,
                "pid": self._pid,
            },
        )
        return True
