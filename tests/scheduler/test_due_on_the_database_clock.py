"""A slot is due when the database server's clock reaches it, whatever the leader's
host clock says: a leader whose clock runs two minutes ahead of the database's fires
nothing early, and one two minutes behind fires nothing late. Every lease is already
read on that clock; "is it due" is the other half of the same rule."""

import asyncio
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text

from app.db import Database
from app.scheduler import JobContext, Scheduler, SchedulerConfig, SystemClock, every
from app.scheduler.clock import MAX_ROUND_TRIP_SECONDS, ServerClock

from ..conftest import SkewedClock, StartScheduler

# How far ahead of the database's now the slot is put: long enough for the skewed
# leader to start and load it before it comes due.
SLOT_AHEAD_SECONDS = 3
# Generous: a leader on the database's clock fires within a tick of the slot.
FIRE_WITHIN_SECONDS = SLOT_AHEAD_SECONDS + 10
# How early a slot may start on the database's clock: the leader reads that clock as
# its own plus an offset measured halfway through a round trip of at most
# MAX_ROUND_TRIP_SECONDS (ServerClock), so by up to half of one (a fraction of a
# millisecond seen on a loaded machine); a leader on its host's clock would be minutes
# early.
MEASUREMENT_ERROR = timedelta(seconds=MAX_ROUND_TRIP_SECONDS / 2)


def _hourly(starts: list[datetime], fired: asyncio.Event, database: Database) -> Scheduler:
    """Job ``hourly`` (its first slot an hour after its row is made), whose body notes
    the database's clock as it begins."""

    async def body(ctx: JobContext) -> None:
        async with database.engine.connect() as conn:
            starts.append(await conn.scalar(text("SELECT clock_timestamp()")))
        fired.set()

    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(body)
    return scheduler


async def _slot_soon(database: Database) -> datetime:
    """Move job hourly's next slot to a few seconds from the database's now."""
    async with database.engine.begin() as conn:
        slot: datetime = await conn.scalar(
            text(
                "UPDATE scheduler_jobs SET next_run_at = clock_timestamp()"
                f" + interval '{SLOT_AHEAD_SECONDS} seconds' WHERE id = 'hourly'"
                " RETURNING next_run_at"
            )
        )
    return slot


async def _first_start_of_a_slot_soon(
    database: Database, start_scheduler: StartScheduler, **leader: Any
) -> tuple[datetime, datetime]:
    """The job's row made by a leader on the database's clock, which then steps down;
    its slot moved a few seconds ahead; a second leader started with ``leader`` (its
    clock, its settings). Returns when that leader's first body started, and the slot."""
    starts: list[datetime] = []
    fired = asyncio.Event()
    first = _hourly(starts, fired, database)
    await (await start_scheduler(first)).wait_until_firing()
    await first.stop()
    slot = await _slot_soon(database)

    await start_scheduler(_hourly(starts, fired, database), **leader)
    async with asyncio.timeout(FIRE_WITHIN_SECONDS):
        await fired.wait()
    return starts[0], slot


async def test_a_leader_on_a_host_two_minutes_off_fires_a_slot_when_the_database_clock_reaches_it(
    database: Database,
    config: SchedulerConfig,
    start_scheduler: StartScheduler,
    skewed_clock: SkewedClock,
) -> None:
    started, slot = await _first_start_of_a_slot_soon(database, start_scheduler, clock=skewed_clock)

    assert started >= slot - MEASUREMENT_ERROR


async def test_a_leader_whose_host_clock_steps_follows_the_database_clock_within_a_tick(
    database: Database, start_scheduler: StartScheduler
) -> None:
    starts: list[datetime] = []
    fired = asyncio.Event()
    host_clock = SkewedClock(timedelta(0))
    supervisor = await start_scheduler(_hourly(starts, fired, database), clock=host_clock)
    await supervisor.wait_until_firing()
    server_clock = supervisor.clock
    assert isinstance(server_clock, ServerClock)

    host_clock.skew = timedelta(minutes=2)  # an NTP step
    async with asyncio.timeout(FIRE_WITHIN_SECONDS):
        while server_clock.offset > timedelta(minutes=-1):
            await asyncio.sleep(0.05)
    slot = await _slot_soon(database)
    async with asyncio.timeout(FIRE_WITHIN_SECONDS):
        await fired.wait()

    assert starts[0] >= slot - MEASUREMENT_ERROR


class _AheadAfterTheFirstReading(SystemClock):
    """A host clock two minutes ahead of the database's, stepped there (NTP) just after
    its first reading: the start's measurement of the server's clock sees a round trip
    of two minutes and is refused, leaving the offset unmeasured."""

    def __init__(self) -> None:
        self.readings = 0

    def now(self) -> datetime:
        self.readings += 1
        real = super().now()
        return real if self.readings == 1 else real + timedelta(minutes=2)


async def test_a_leader_whose_first_clock_reading_is_refused_fires_no_slot_early(
    database: Database, start_scheduler: StartScheduler
) -> None:
    started, slot = await _first_start_of_a_slot_soon(
        database,
        start_scheduler,
        clock=_AheadAfterTheFirstReading(),
        leader_tick_seconds=5,
        lease_seconds=30,
    )

    assert started >= slot - MEASUREMENT_ERROR, f"fired {slot - started} before its slot"
