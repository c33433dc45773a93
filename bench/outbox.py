"""Outbox drain throughput and enqueue-to-delivery latency, each beside a baseline.

Throughput: 20,000 due rows and a receiver that does nothing, drained by one and by
four concurrent drain_once() calls, next to the ceiling measured in the same run: a
plain asyncpg loop doing the same claim and a per-row UPDATE with its own COMMIT.

Latency: one enqueue per second, committed, until delivered: through the NOTIFY
wake-up (the leader's listener service), against the 1-minute drain tick alone.

    python bench/outbox.py [--rows 20000] [--events 30] [--tick-minutes 2]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg
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
    async with database.engine.begin() as conn:
        await conn.execute(FILL, {"outbox": outbox, "rows": rows})


async def _ceiling(database: Database, url: str, rows: int) -> float:
    await _fill(database, "ceiling", rows)
    compiled = sql.CLAIM_DUE.compile(dialect=database.engine.dialect)
    claim, order = str(compiled), list(compiled.positiontup or [])
    connection = await asyncpg.connect(asyncpg_dsn(url))
    started = time.perf_counter()
    try:
        while True:
            now = datetime.now(UTC)
            token = uuid.uuid4()
            values = {
                "token": token,
                "lease_until": now + timedelta(seconds=60),
                "now": now,
                "outbox": "ceiling",
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


async def _drainers(database: Database, url: str, rows: int, count: int) -> float:
    name = f"throughput_{count}"
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


async def _run(url: str, args: argparse.Namespace) -> None:
    database = Database.from_url(url, pool_size=10)
    ceiling = await _ceiling(database, url, args.rows)
    one = await _drainers(database, url, args.rows, 1)
    four = await _drainers(database, url, args.rows, 4)
    notified = await _latency(database, url, args.events, notify=True)
    ticked = await _latency(database, url, int(args.tick_minutes * 60), notify=False)
    await database.dispose()

    print(f"\ndrain throughput, {args.rows} rows, no-op receiver")
    print(f"{'drainer':<34} {'rows/s':>9} {'x ceiling':>10}")
    print(f"{'asyncpg claim+UPDATE loop (ceiling)':<34} {ceiling:>9.0f} {1:>10.2f}")
    print(f"{'Outbox.drain_once x1':<34} {one:>9.0f} {one / ceiling:>10.2f}")
    print(f"{'Outbox.drain_once x4 concurrent':<34} {four:>9.0f} {four / ceiling:>10.2f}")
    print("\nenqueue-to-delivery latency, one event per second; ms")
    print(f"{'wake-up':<34} {'events':>7} {'p50':>9} {'p99':>9}")
    for label, values in (("NOTIFY listener", notified), ("1-minute tick alone", ticked)):
        print(
            f"{label:<34} {len(values):>7} {percentile(values, 0.5) * 1000:>9.1f}"
            f" {percentile(values, 0.99) * 1000:>9.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=30)
    parser.add_argument("--tick-minutes", type=float, default=2)
    args = parser.parse_args()
    with migrated_database() as url:
        asyncio.run(_run(url, args))


if __name__ == "__main__":
    main()
