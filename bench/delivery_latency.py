"""Enqueue-to-delivery latency of single messages, beside a plain LISTEN/claim floor.

Both sides use the outbox table and the outbox's own statements, in one process and
one run, events alternating between them so that both see the same load:

- floor: plain asyncpg. The enqueue is BEGIN, INSERT, pg_notify, COMMIT on one
  connection; a second connection LISTENs and on each notification runs the claim
  (UPDATE ... RETURNING), calls the receiver, and marks the row delivered.
- Regent: ``Outbox.enqueue`` in an AsyncSession transaction (the app's engine, its
  pool as shipped), the leader's NOTIFY wake-up service, its drain, the receiver.

Each event is one message, enqueued once the previous one's drain pass has ended
(outcome and drain record written), so every figure is a lone message's latency.
Printed, in ms: p50 and p95 from the start of the enqueue and from its COMMIT's
return to the receiver's call; Regent minus floor; the load average.

    python bench/delivery_latency.py [--events 500] [--warmup 30]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
from _server import migrated_database, percentile, start_leading

from app.db import Database, asyncpg_dsn
from app.outbox import Message, Outbox, sql
from app.outbox.drain import _asyncpg_form
from app.scheduler import Scheduler

FLOOR = "floor"
REGENT = "regent"


class _Timings:
    """Per event: perf_counter at the enqueue's start, at its commit, at delivery."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.committed: dict[str, float] = {}
        self.delivered: dict[str, float] = {}
        self.arrived = asyncio.Event()

    def receive(self, key: str) -> None:
        self.delivered[key] = time.perf_counter()
        self.arrived.set()

    def figures(self, keys: list[str]) -> tuple[list[float], list[float]]:
        from_start = [self.delivered[k] - self.started[k] for k in keys]
        from_commit = [self.delivered[k] - self.committed[k] for k in keys]
        return from_start, from_commit


class _Floor:
    """The floor: LISTEN, then claim, deliver, mark delivered, on each notification."""

    def __init__(self, dsn: str, timings: _Timings) -> None:
        self.dsn = dsn
        self.timings = timings
        self.idle = asyncio.Event()
        self.idle.set()
        self._wake = asyncio.Event()
        self._claim = _asyncpg_form(sql.CLAIM_DUE)
        self._mark = _asyncpg_form(sql.MARK_DELIVERED)
        self._insert = _asyncpg_form(sql.INSERT)
        self._notify = _asyncpg_form(sql.NOTIFY)

    async def run(self) -> None:
        listener = await asyncpg.connect(self.dsn)

        def on_notify(_conn: object, _pid: int, _channel: str, payload: str) -> None:
            if payload == FLOOR:
                self.idle.clear()
                self._wake.set()

        await listener.add_listener(sql.NOTIFY_CHANNEL, on_notify)
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                await self._pass(listener)
                if not self._wake.is_set():
                    self.idle.set()
        finally:
            await listener.close()

    async def _pass(self, connection: asyncpg.Connection) -> None:
        now = datetime.now(UTC)
        token = uuid.uuid4()
        values = {
            "token": token,
            "lease_until": now + timedelta(seconds=60),
            "now": now,
            "outbox": FLOOR,
            "batch_size": 50,
        }
        query, names = self._claim
        rows = await connection.fetch(query, *(values[name] for name in names))
        for row in rows:
            self.timings.receive(row["key"])
        query, names = self._mark
        marks = {"ids": [r["id"] for r in rows], "tokens": [token] * len(rows), "now": now}
        await connection.fetch(query, *(marks[name] for name in names))

    async def enqueue(self, connection: asyncpg.Connection, key: str) -> None:
        self.timings.started[key] = time.perf_counter()
        values = {"outbox": FLOOR, "key": key, "payload": "{}", "now": datetime.now(UTC)}
        async with connection.transaction():
            query, names = self._insert
            await connection.fetchval(query, *(values[name] for name in names))
            query, names = self._notify
            await connection.execute(query, *(values[name] for name in names))
        self.timings.committed[key] = time.perf_counter()


async def _drain_recorded(connection: asyncpg.Connection, since: datetime) -> None:
    """Return once Regent's drain recorded a pass that ended after ``since``: the
    RECORD_DRAIN is the last statement of a pass."""
    while True:
        last = await connection.fetchval(
            "SELECT last_drain_at FROM outbox_drains WHERE outbox = $1", REGENT
        )
        if last is not None and last >= since:
            return
        await asyncio.sleep(0.001)


async def _one(
    timings: _Timings, key: str, enqueue: Callable[[], Awaitable[None]], timeout: float = 10
) -> None:
    timings.arrived.clear()
    await enqueue()
    async with asyncio.timeout(timeout):
        while key not in timings.delivered:
            await timings.arrived.wait()
            timings.arrived.clear()


async def _run(url: str, events: int, warmup: int) -> None:
    dsn = asyncpg_dsn(url)
    database = Database.from_url(url)
    floor_timings, regent_timings = _Timings(), _Timings()

    async def receive(message: Message) -> None:
        regent_timings.receive(message.key)

    scheduler = Scheduler()
    outbox = Outbox(REGENT, receive, scheduler=scheduler)
    outbox.bind(database.engine, listen_dsn=dsn)
    await start_leading(scheduler, database)
    floor = _Floor(dsn, floor_timings)
    floor_task = asyncio.create_task(floor.run())
    enqueuer = await asyncpg.connect(dsn)
    watcher = await asyncpg.connect(dsn)
    load_before = os.getloadavg()

    async def regent_enqueue(key: str) -> None:
        regent_timings.started[key] = time.perf_counter()
        async with database.sessions() as session, session.begin():
            await outbox.enqueue(session, {}, key=key)
        regent_timings.committed[key] = time.perf_counter()

    measured: list[str] = []
    try:
        for index in range(warmup + events):
            key = f"event-{index}"
            await _one(floor_timings, key, lambda key=key: floor.enqueue(enqueuer, key))
            await floor.idle.wait()
            delivered_at = datetime.now(UTC)
            await _one(regent_timings, key, lambda key=key: regent_enqueue(key))
            await _drain_recorded(watcher, delivered_at)
            if index >= warmup:
                measured.append(key)
    finally:
        floor_task.cancel()
        await asyncio.gather(floor_task, return_exceptions=True)
        await enqueuer.close()
        await watcher.close()
        await scheduler.stop()
        await database.dispose()
    load_after = os.getloadavg()
    print(
        f"\nenqueue -> delivery, {events} single messages each (after {warmup} warm-up),"
        f" alternating; load average before {load_before[0]:.2f} / after {load_after[0]:.2f}"
        f" ({os.cpu_count()} cores); ms"
    )
    print(f"{'path':<70} {'p50':>7} {'p95':>7} {'mean':>7}")
    rows = {}
    for label, timings in (
        ("floor: asyncpg INSERT+NOTIFY / LISTEN + claim UPDATE", floor_timings),
        ("Regent: Outbox.enqueue / NOTIFY wake-up + drain", regent_timings),
    ):
        from_start, from_commit = timings.figures(measured)
        rows[label] = (from_start, from_commit)
        for part, values in (("enqueue start", from_start), ("commit", from_commit)):
            print(
                f"{label + ', from ' + part:<70}"
                f" {percentile(values, 0.5) * 1000:>7.2f} {percentile(values, 0.95) * 1000:>7.2f}"
                f" {statistics.fmean(values) * 1000:>7.2f}"
            )
    (floor_start, floor_commit), (regent_start, regent_commit) = rows.values()
    for part, regent, floor_values in (
        ("enqueue start", regent_start, floor_start),
        ("commit", regent_commit, floor_commit),
    ):
        gap = percentile(regent, 0.5) - percentile(floor_values, 0.5)
        print(f"{'Regent p50 - floor p50, from ' + part:<70} {gap * 1000:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    with migrated_database() as url:
        asyncio.run(_run(url, args.events, args.warmup))


if __name__ == "__main__":
    main()
