"""The leader-only long-poll consumer: one consumer across workers, resumes after
failover from the stored offset, never processes an update twice."""

import asyncio

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.jobs import updates_consumer
from app.jobs.gateways import Update
from app.scheduler import Role, Scheduler

from ..conftest import StartScheduler
from .conftest import FakeUpdates


async def _processed(engine: AsyncEngine) -> list[int]:
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT update_id FROM processed_updates ORDER BY 1"))
        return [row[0] for row in rows]


async def _until_processed(engine: AsyncEngine, count: int) -> None:
    async with asyncio.timeout(10):
        while len(await _processed(engine)) < count:
            await asyncio.sleep(0.02)


async def test_one_consumer_across_workers_and_failover_resumes_from_the_offset(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    source = FakeUpdates([Update(n, f"/start {n}") for n in range(10)])
    schedulers = [Scheduler() for _ in range(3)]
    supervisors = []
    for scheduler in schedulers:
        updates_consumer.register(scheduler, source)
        supervisors.append(await start_scheduler(scheduler))
    await _until_processed(engine, 10)
    assert source.most_active == 1
    leader = next(
        scheduler
        for scheduler, supervisor in zip(schedulers, supervisors, strict=True)
        if supervisor.role is Role.LEADER
    )
    await leader.stop()
    polled_before = len(source.offsets)
    source.backlog += [Update(n, f"/help {n}") for n in range(10, 15)]
    await _until_processed(engine, 15)
    assert source.offsets[polled_before] >= 10, "the new leader started over"
    assert await _processed(engine) == list(range(15))
    assert source.most_active == 1
