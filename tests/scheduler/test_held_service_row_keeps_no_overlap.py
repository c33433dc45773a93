"""A busy row lets no second copy of a service start: a service's row that another
transaction holds (an operator's psql session left open on ``SELECT ... FOR UPDATE``
on ``scheduler_services``) while a copy of the service runs, for longer than the
running lease, does not let another leader start its copy beside the running one once
the row is free. The copy's process is alive and renewing all along; only the held row
kept its renewals out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.scheduler import FakeClock
from app.scheduler.batching import LeaseKeeper
from app.scheduler.carried import Carried
from app.scheduler.store import HeldLease, JobStore

from .conftest import service_row_held

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE_SECONDS = 6.0


def _store(database: Database, clock: FakeClock, pid: int) -> JobStore:
    return JobStore(database.engine, pid=pid, host=f"host-{pid}", lease_clock=clock)


async def test_a_service_whose_row_was_held_past_its_lease_does_not_start_a_second_copy(
    database: Database, engine: AsyncEngine, leader_key_backend: int
) -> None:
    clock = FakeClock(T0)
    owner = _store(database, clock, pid=1)
    took = await owner.take_service_lease("consumer", LEASE_SECONDS, leader_key_backend)
    assert took.run_id is not None
    lease = HeldLease("consumer", took.run_id, "service")
    # The copy runs: its lease is renewed by the process's one lease keeper.
    keeper = LeaseKeeper(owner, clock=clock, lease_seconds=LEASE_SECONDS, carried=Carried())
    keeper.hold(lease)
    successor = _store(database, clock, pid=2)
    try:
        async with service_row_held(engine, "consumer") as holder:
            # The keeper tries every period (and, should a try fail, again within
            # seconds), the service's row held all along. Past a lease of that:
            while clock.now() < T0 + timedelta(seconds=LEASE_SECONDS + 1):
                # The keeper (the only sleeper) is parked between its tries.
                await clock.wait_for_sleepers(1, timeout=10)
                clock.advance(1)
            await clock.wait_for_sleepers(1, timeout=10)
            await holder.rollback()
        # The row is free, and the next leader tries to start its copy before the
        # keeper tries again.
        second = await successor.take_service_lease("consumer", LEASE_SECONDS, leader_key_backend)
        assert second.run_id is None, (
            f"a second copy of 'consumer' took the lease ({second}) while the first copy, "
            "alive and renewing in its process, still runs"
        )
        assert second.pid == 1, f"the running copy is not named as the holder: {second}"
    finally:
        keeper.drop(lease.run_id)
        # The keeper's renewer wakes, finds nothing to renew, and ends.
        clock.advance(LEASE_SECONDS)
