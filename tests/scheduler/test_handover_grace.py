"""The handover grace waits only for a previous leader that may still be running.

A previous leader whose backend left the server (its process killed, its connection
terminated) can fire nothing more, so its successor fires without the grace; one whose
backend is still there (a graceful handover) gets the whole grace.
"""

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler import FakeClock, Role, Scheduler, SchedulerConfig, every
from app.scheduler.keys import SCHEDULER_LEADER_KEY
from app.scheduler.supervisor import Supervisor
from app.scheduler.tenure import _GONE_POLL_SECONDS

from .conftest import StartScheduler

GRACE = 5.0
# The fake clock moves in steps of one poll of the previous leader's backend while the
# new leader waits to fire.
STEP = _GONE_POLL_SECONDS


@pytest.fixture
async def previous_leader(config: SchedulerConfig) -> AsyncIterator[asyncpg.Connection]:
    """A leader's session: it holds the key and has recorded its leadership, as every
    leader does before its first claim."""
    connection = await asyncpg.connect(config.lock_dsn)
    try:
        await connection.execute("SELECT pg_advisory_lock($1)", SCHEDULER_LEADER_KEY)
        await connection.execute(
            "INSERT INTO scheduler_leadership (schedule, pid, host, backend_pid, since,"
            " heartbeat_at, term) VALUES ('default', 0, 'previous', pg_backend_pid(), now(),"
            " now(), 1)"
        )
        yield connection
    finally:
        connection.terminate()


async def _successor(start_scheduler: StartScheduler, clock: FakeClock) -> Supervisor:
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="after_handover")(lambda ctx: None)
    supervisor = await start_scheduler(scheduler, clock=clock, handover_grace_seconds=GRACE)
    await supervisor.wait_for_role(Role.STANDBY)
    return supervisor


async def _fake_seconds_until_firing(
    supervisor: Supervisor, clock: FakeClock, *, handover_polls_only: bool = False
) -> float:
    """Move the fake clock a STEP each time the new leader parks on it, until it fires;
    returns how far the clock moved.

    With ``handover_polls_only`` it moves only for a sleep of exactly one poll of the
    previous leader's backend: another loop's sleep (a standby's watch) would otherwise
    move the clock once per turn of the event loop, as fast as real time passes, and a
    slow machine would look like a grace kept."""
    moved = 0.0
    firing = asyncio.ensure_future(supervisor.wait_until_firing(timeout=60))
    while True:
        if handover_polls_only:
            poll_ends = clock.now() + timedelta(seconds=STEP)
            parked = asyncio.ensure_future(clock.wait_for_a_sleeper_until(poll_ends, timeout=60))
        else:
            parked = asyncio.ensure_future(clock.wait_for_sleepers(timeout=60))
        await asyncio.wait({firing, parked}, return_when=asyncio.FIRST_COMPLETED)
        parked.cancel()
        if firing.done():
            break
        clock.advance(STEP)
        moved += STEP
    await firing
    return moved


async def test_a_successor_of_a_terminated_leader_fires_without_the_grace(
    start_scheduler: StartScheduler,
    engine: AsyncEngine,
    previous_leader: asyncpg.Connection,
    fake_clock: FakeClock,
) -> None:
    successor = await _successor(start_scheduler, fake_clock)
    async with engine.connect() as conn:
        await conn.execute(
            text("SELECT pg_terminate_backend(:pid, 5000)"),
            {"pid": previous_leader.get_server_pid()},
        )
    moved = await _fake_seconds_until_firing(successor, fake_clock, handover_polls_only=True)
    assert moved < GRACE / 5, f"the successor waited {moved:.2f} s of a {GRACE:g} s grace"


async def test_a_successor_of_a_leader_still_connected_waits_the_whole_grace(
    start_scheduler: StartScheduler, previous_leader: asyncpg.Connection, fake_clock: FakeClock
) -> None:
    successor = await _successor(start_scheduler, fake_clock)
    # It lets go of the key and stays connected, as a leader does on its way out.
    await previous_leader.execute("SELECT pg_advisory_unlock($1)", SCHEDULER_LEADER_KEY)
    await successor.wait_for_role(Role.LEADER)
    moved = await _fake_seconds_until_firing(successor, fake_clock)
    assert moved >= GRACE - STEP / 2, f"fired after {moved:.2f} s of a {GRACE:g} s grace"
