"""pgqueuer drained beside Regent's outbox: the same rows, the same no-op work.

pgqueuer's consumer (``QueueManager.run``) dequeues ``batch_size`` jobs per statement
(10 as shipped), starts every one of them at once (no cap on concurrent tasks unless
``max_concurrent_tasks`` is given), and buffers their completions, writing them in one
statement per ``batch_size`` completions or every 0.1 s. ``mode=drain`` returns once
the queue is empty and its tasks are done.

Needs the ``bench`` extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg

try:
    from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager
    from pgqueuer.types import QueueExecutionMode
except ImportError as exc:
    raise SystemExit("bench/outbox.py needs pgqueuer: pip install -e '.[bench]'") from exc

__all__ = ["install", "pgqueuer_drain"]


async def install(dsn: str) -> None:
    """Create pgqueuer's tables in the benchmark database."""
    connection = await asyncpg.connect(dsn)
    try:
        await Queries(AsyncpgDriver(connection)).install()
    finally:
        await connection.close()


async def pgqueuer_drain(dsn: str, rows: int, consumers: int, batch_size: int) -> float:
    """Enqueue ``rows`` jobs, drain them with ``consumers`` queue managers (one
    connection each) at ``batch_size``, and return the jobs done per second."""
    connections = [await asyncpg.connect(dsn) for _ in range(consumers)]
    try:
        queries = Queries(AsyncpgDriver(connections[0]))
        await connections[0].execute("TRUNCATE pgqueuer_log")
        await queries.enqueue(["noop"] * rows, [None] * rows, [0] * rows)
        # As for the outbox's table: every drainer starts on a clean one.
        await connections[0].execute("VACUUM ANALYZE pgqueuer")
        managers = [QueueManager(Queries(AsyncpgDriver(c))) for c in connections]
        for manager in managers:

            @manager.entrypoint("noop")
            async def noop(job: Job) -> None:
                return None

        started = time.perf_counter()
        await asyncio.gather(
            *(m.run(batch_size=batch_size, mode=QueueExecutionMode.drain) for m in managers)
        )
        elapsed = time.perf_counter() - started
        left = await connections[0].fetchval("SELECT count(*) FROM pgqueuer")
        if left:
            raise SystemExit(f"pgqueuer left {left} of {rows} jobs undone")
        return rows / elapsed
    finally:
        for connection in connections:
            await connection.close()
