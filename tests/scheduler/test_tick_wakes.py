"""The leader's tick wakes the job timer only for rows that changed (it reads only those:
test_many_jobs.py): with 10,000 jobs, waking them all each tick delayed every fire by
the time it took them all to go back to sleep."""

import asyncio
from datetime import UTC, datetime

from app.scheduler import FakeClock, JobContext, Scheduler, every

from .conftest import StartScheduler

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JOBS = 20


class CountingClock(FakeClock):
    """A FakeClock that counts sleep() calls: a woken waiter parks again."""

    def __init__(self, start: datetime) -> None:
        super().__init__(start)
        self.calls = 0
        self._called = asyncio.Condition()

    async def sleep(self, seconds: float) -> None:
        self.calls += 1
        async with self._called:
            self._called.notify_all()
        await super().sleep(seconds)

    async def wait_for_calls(self, count: int, timeout: float = 10) -> None:
        async with asyncio.timeout(timeout), self._called:
            await self._called.wait_for(lambda: self.calls >= count)


async def _noop(ctx: JobContext) -> None:
    return None


async def test_a_tick_that_changed_no_row_wakes_no_job_loop(
    start_scheduler: StartScheduler,
) -> None:
    clock = CountingClock(T0)
    scheduler = Scheduler()
    for index in range(JOBS):
        scheduler.job(every(hours=1), id=f"hourly-{index}")(_noop)
    supervisor = await start_scheduler(scheduler, clock=clock)
    await supervisor.wait_until_firing()
    await clock.wait_for_sleepers(2)
    before = clock.calls
    for tick in (1, 2):
        clock.advance(supervisor.config.leader_tick_seconds)
        await clock.wait_for_calls(before + tick)
    await clock.wait_for_sleepers(2)
    assert clock.calls == before + 2
