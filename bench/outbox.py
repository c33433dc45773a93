"""Outbox drain throughput and enqueue-to-delivery latency, each beside a baseline.

Throughput: 20,000 due rows and a receiver that does nothing, drained by one and by
four concurrent drain_once() calls (the outbox's defaults: batch_size 50, concurrency
10), next to, in the same run: the per-row ceiling, a plain asyncpg loop doing the
same claim and a per-row UPDATE with its own COMMIT; and pgqueuer, one and four
consumers, at its shipped batch size (10) and at 50.

Latency: one enqueue per second, committed, until delivered: through the NOTIFY
wake-up (the leader's listener service), against the 1-minute drain tick alone.

    pip install -e '.[bench]'
    python bench/outbox.py [--rows 20000] [--runs 1] [--events 30] [--tick-minutes 2]
                           [--no-latency]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import asyncpg
from _pgqueuer import install, pgqueuer_drain
from _server import migrated_database, percentile, start_leading
from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.outbox import Message, Outbox, sql
from app.scheduler import Scheduler

FILL = text(
    """
    INSERT INTO outbox_messages
        (outbox, key, payload, status, attempts, next_attempt_at, created_at, updated_at)
    SELECT :outbox, 'k' || n, jsonb_build_object('n', n), 'pending', 0, now(), now(), now()
    FROM generate_series(1, :rows) AS n
    """
)
CEILING_MARK = (
    "UPDATE outbox_messages SET status = 'delivered', attempts = attempts + 1,"
    " delivered_at = now(), updated_at = now(), claimed_by = NULL"
    " WHERE id = $1 AND claimed_by = $2"
)


async def _noop(message: Message) -> None:
    return None


async def _fill(database: Database, outbox: str, rows: int) -> None:
    """Add ``rows`` due rows, then vacuum: every drainer starts on a clean table."""
    async with database.engine.begin() as conn:
        await conn.execute(FILL, {"outbox": outbox, "rows": rows})
    connection = await asyncpg.connect(asyncpg_dsn(database.url))
    try:
        await connection.execute("VACUUM ANALYZE outbox_messages")
    finally:
        await connection.close()


async def _ceiling(database: Database, url: str, rows: int, run: int) -> float:
    await _fill(database, f"ceiling_{run}", rows)
    compiled = sql.CLAIM_DUE.compile(dialect=database.engine.dialect)
    claim, order = str(compiled), list(compiled.positiontup or [])
    connection = await asyncpg.connect(asyncpg_dsn(url))
    started = time.perf_counter()
    try:
        while True:
            token = uuid.uuid4()
            values = {
                "token": token,
                # The lease clock is the database server's, as the drain's under the
                # system clock.
                "lease_now": None,
                "lease_seconds": 60.0,
                "outbox": f"ceiling_{run}",
                "batch_size": 50,
            }
            claimed = await connection.fetch(claim, *(values[name] for name in order))
            for row in claimed:
                await connection.execute(CEILING_MARK, row["id"], token)
            if len(claimed) < 50:
                break
    finally:
        await connection.close()
    return rows / (time.perf_counter() - started)


async def _drainers(database: Database, url: str, rows: int, count: int, run: int) -> float:
    name = f"throughput_{count}_{run}"
    outbox = Outbox(name, _noop, batch_size=50)
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(url))
    await _fill(database, name, rows)
    started = time.perf_counter()
    await asyncio.gather(*(outbox.drain_once() for _ in range(count)))
    return rows / (time.perf_counter() - started)


async def _latency(database: Database, url: str, events: int, notify: bool) -> list[float]:
    enqueued_at: dict[str, float] = {}
    latencies: list[float] = []

    async def receive(message: Message) -> None:
        latencies.append(time.perf_counter() - enqueued_at[message.key])

    scheduler = Scheduler()
    name = "notified" if notify else "ticked"
    outbox = Outbox(name, receive, scheduler=scheduler if notify else None)
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(url))
    tick: asyncio.Task[None] | None = None
    if notify:
        await start_leading(scheduler, database)
    else:

        async def every_minute() -> None:
            while True:
                await asyncio.sleep(60)
                await outbox.drain_once()

        tick = asyncio.create_task(every_minute())
    for index in range(events):
        key = f"event-{index}"
        enqueued_at[key] = time.perf_counter()
        async with database.sessions() as session, session.begin():
            await outbox.enqueue(session, {"index": index}, key=key)
        await asyncio.sleep(1)
    while len(latencies) < events:  # noqa: ASYNC110 - the receiver appends from the drain
        await asyncio.sleep(0.05)
    if tick is not None:
        tick.cancel()
    await scheduler.stop()
    return latencies


async def _throughput(database: Database, url: str, rows: int, run: int) -> None:
    dsn = asyncpg_dsn(url)
    load = os.getloadavg()
    ceiling = await _ceiling(database, url, rows, run)
    figures = [
        ("asyncpg claim+UPDATE loop (ceiling)", ceiling),
        ("Outbox.drain_once x1", await _drainers(database, url, rows, 1, run)),
        ("Outbox.drain_once x4 concurrent", await _drainers(database, url, rows, 4, run)),
    ]
    for batch_size in (10, 50):
        for consumers in (1, 4):
            rate = await pgqueuer_drain(dsn, rows, consumers, batch_size)
            figures.append((f"pgqueuer batch {batch_size} x{consumers}", rate))
    print(
        f"\ndrain throughput, run {run + 1}, {rows} rows, no-op receiver;"
        f" load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(f"{'drainer':<36} {'rows/s':>9} {'x ceiling':>10}")
    for label, rate in figures:
        print(f"{label:<36} {rate:>9.0f} {rate / ceiling:>10.2f}")


async def _run(url: str, args: argparse.Namespace) -> None:
    database = Database.from_url(url, pool_size=10)
    await install(asyncpg_dsn(url))
    for run in range(args.runs):
        await _throughput(database, url, args.rows, run)
    if args.latency:
        notified = await _latency(database, url, args.events, notify=True)
        ticked = await _latency(database, url, int(args.tick_minutes * 60), notify=False)
        print("\nenqueue-to-delivery latency, one event per second; ms")
        print(f"{'wake-up':<34} {'events':>7} {'p50':>9} {'p99':>9}")
        for label, values in (("NOTIFY listener", notified), ("1-minute tick alone", ticked)):
            print(
                f"{label:<34} {len(values):>7} {percentile(values, 0.5) * 1000:>9.1f}"
                f" {percentile(values, 0.99) * 1000:>9.1f}"
            )
    await database.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=1, help="throughput runs, one table each")
    parser.add_argument("--no-latency", dest="latency", action="store_false")
    parser.add_argument("--events", type=int, default=30)
    parser.add_argument("--tick-minutes", type=float, default=2)
    args = parser.parse_args()
    with migrated_database() as url:
        asyncio.run(_run(url, args))


if __name__ == "__main__":
    main()
