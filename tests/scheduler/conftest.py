"""Scheduler test helpers: who holds the key, which runs were recorded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.keys import LEADER_KEY_LOCKS

from ..conftest import StartScheduler

__all__ = ["StartScheduler", "eventually", "holder_count", "runs", "wait_for_runs"]

HOLDERS_SQL = text(f"SELECT count(*) FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND granted")


async def holder_count(engine: AsyncEngine) -> int:
    """How many sessions hold the leader key in this database (the seed's query)."""
    async with engine.connect() as conn:
        count: int = (await conn.execute(HOLDERS_SQL)).scalar_one()
        return count


async def eventually(
    condition: Callable[[], Awaitable[bool]], timeout: float = 10, what: str = "condition"
) -> None:
    """Re-check a database condition until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def runs(engine: AsyncEngine, job_id: str) -> list[tuple[str, Any]]:
    """(status, slot) of every recorded run of a job, oldest first."""
    async with engine.connect() as conn:
        result = await conn.execute(
            text("SELECT status, slot FROM scheduler_runs WHERE job_id = :id ORDER BY id"),
            {"id": job_id},
        )
        return [(row.status, row.slot) for row in result]


async def wait_for_runs(
    engine: AsyncEngine, job_id: str, count: int, *, finished: bool = True, timeout: float = 10
) -> list[tuple[str, Any]]:
    """Wait until ``count`` runs of the job are recorded (and finished)."""

    async def enough() -> bool:
        rows = await runs(engine, job_id)
        done = [row for row in rows if not finished or row[0] != "running"]
        return len(done) >= count

    await eventually(enough, timeout, f"{count} runs of {job_id}")
    return await runs(engine, job_id)
