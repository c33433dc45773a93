"""A leadership's services: each started once the whole handover grace has passed and
no other copy of it holds the service's running lease."""

from __future__ import annotations

import asyncio
import logging
import os

from .clock import Clock
from .election import LockConnection
from .loop import Stop, run_loop
from .registry import ServiceSpec
from .service_copies import ServiceCopies
from .store import HeldLease

__all__ = ["run_service_after"]

logger = logging.getLogger("app.scheduler")


async def run_service_after(
    spec: ServiceSpec,
    grace_ends: float,
    lock: LockConnection,
    *,
    copies: ServiceCopies,
    clock: Clock,
    tick_seconds: float,
    firing: asyncio.Event,
) -> None:
    """Run a service once the whole handover grace has passed (``grace_ends``, on
    Clock.monotonic) and no other copy of
    it holds the service's running lease. The grace ends early for jobs when the
    previous leader's backend is gone, since their claims are fenced; a service has
    no fence, and the old leader's copy of it runs until that leader notices its
    loss, which the grace gives it time to do. A copy that outlives its leadership
    (a thread of it still runs) holds its lease until it ended, or, its process
    dead, until the lease ran out. A crashed service is restarted only while
    ``firing`` is set (see ServiceCopies.run)."""
    wait = grace_ends - clock.monotonic()
    if wait > 0:
        await clock.sleep(wait)
    lease = await _take_service_lease(spec, lock, copies=copies, clock=clock, tick=tick_seconds)
    await copies.run(spec, firing, lease)


async def _take_service_lease(
    spec: ServiceSpec, lock: LockConnection, *, copies: ServiceCopies, clock: Clock, tick: float
) -> HeldLease:
    """Take the service's running lease for this leadership's copy, waiting while
    another copy holds it: tried again when a release's NOTIFY comes, else every
    tick or as the holder's lease runs out, whichever is first."""
    released = asyncio.Event()
    await lock.on_wake(released.set)
    waiting = False

    async def take() -> float | Stop[HeldLease]:
        nonlocal waiting
        released.clear()
        took = await copies.take_lease(spec, lock.backend_pid)
        if took.run_id is not None:
            return Stop(HeldLease(spec.id, took.run_id, "service"))
        if took.pid is not None and not waiting:
            waiting = True
            logger.warning(
                "service.waiting_for_previous_copy: service %s still runs elsewhere "
                "(pid %s on %s, a thread of a stopped copy or a process that died); "
                "starting it once that copy ends or its lease runs out, in at most %.1f s "
                "(pid=%s)",
                spec.id,
                took.pid,
                took.host,
                took.left,
                os.getpid(),
                extra={
                    "action": "service.waiting_for_previous_copy",
                    "service_id": spec.id,
                    "pid": os.getpid(),
                },
            )
        # No holder: released meanwhile (its NOTIFY is on its way) or this leader
        # lost the key (it steps down): a tick at most.
        return tick if took.pid is None else min(tick, max(took.left, 0.0))

    return await run_loop(take, clock, wakes=[released.wait])
