"""Enqueue-to-delivery latency of single messages, beside a plain LISTEN/claim floor.

Both sides use the outbox table and the outbox's own statements, in one process and
one run, events alternating between them so that both see the same load:

- floor: plain asyncpg. The enqueue is BEGIN, INSERT, pg_notify, COMMIT on one
  connection; a second connection LISTENs and on each notification runs the claim
  (UPDATE ... RETURNING), calls the receiver, and marks the row delivered.
- Regent: ``Outbox.enqueue`` in an AsyncSession transaction (the app's engine, its
  pool as shipped), the leader's NOTIFY wake-up service, its drain, the receiver;
- the same, the enqueue's session from an engine without pool_pre_ping: what the
  app engine's pre-ping at checkout costs the caller's transaction.

Each event is one message, enqueued once the previous one's drain pass has ended
(outcome and drain record written), so every figure is a lone message's latency.
Printed, in ms: p50 and p95 from the start of the enqueue and from its COMMIT's
return to the receiver's call; Regent minus floor; the load average.

    python bench/delivery_latency.py [--events 500] [--warmup 30]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg
from _server import migrated_database, percentile, start_leading
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker, create_async_engine

from app.db import Database, async_url, asyncpg_dsn
from app.outbox import Message, Outbox, sql
from app.outbox.connection import _asyncpg_form
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
        token = uuid.uuid4()
        # The lease clock is the database server's (lease_now NULL), as the drain's.
        values = {
            "token": token,
            "lease_now": None,
            "lease_seconds": 60.0,
            "outbox": FLOOR,
            "batch_size": 50,
        }
        query, names = self._claim
        rows = await connection.fetch(query, *(values[name] for name in names))
        for row in rows:
            self.timings.receive(row["key"])
        query, names = self._mark
        marks = {"ids": [r["id"] for r in rows], "tokens": [token] * len(rows), "lease_now": None}
        await connection.fetch(query, *(marks[name] for name in names))

    async def enqueue(self, connection: asyncpg.Connection, key: str) -> None:
        self.timings.started[key] = time.perf_counter()
        values = {
            "outbox": FLOOR,
            "key": key,
            "payload": "{}",
            "lease_now": None,
            # Due at once, as Outbox.enqueue with neither at= nor delay=.
            "deliver_at": None,
            "delay": timedelta(0),
        }
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
    # The caller's side only: the same enqueue through an engine that does not
    # pre-ping its connections at checkout, to show what the app engine's pre-ping
    # (pool_pre_ping=True in app/db.py) costs an enqueue.
    unpinged = create_async_engine(async_url(url), pool_size=5, pool_pre_ping=False)
    unpinged_sessions = async_sessionmaker(unpinged, expire_on_commit=False)
    floor_timings, regent_timings, unpinged_timings = _Timings(), _Timings(), _Timings()

    async def receive(message: Message) -> None:
        prefix = message.key.split("-", 1)[0]
        (unpinged_timings if prefix == "unpinged" else regent_timings).receive(message.key)

    scheduler = Scheduler()
    outbox = Outbox(REGENT, receive, scheduler=scheduler)
    outbox.bind(database.engine, listen_dsn=dsn)
    await start_leading(scheduler, database)
    floor = _Floor(dsn, floor_timings)
    floor_task = asyncio.create_task(floor.run())
    enqueuer = await asyncpg.connect(dsn)
    watcher = await asyncpg.connect(dsn)
    load_before = os.getloadavg()

    async def regent_enqueue(
        timings: _Timings, sessions: async_sessionmaker[AsyncSession], key: str
    ) -> None:
        timings.started[key] = time.perf_counter()
        async with sessions() as session, session.begin():
            await outbox.enqueue(session, {}, key=key)
        timings.committed[key] = time.perf_counter()

    async def through_regent(
        timings: _Timings, sessions: async_sessionmaker[AsyncSession], key: str
    ) -> None:
        delivered_at = datetime.now(UTC)
        await _one(timings, key, lambda: regent_enqueue(timings, sessions, key))
        await _drain_recorded(watcher, delivered_at)

    measured: list[int] = []
    try:
        for index in range(warmup + events):
            key = f"floor-{index}"
            await _one(floor_timings, key, functools.partial(floor.enqueue, enqueuer, key))
            await floor.idle.wait()
            await through_regent(regent_timings, database.sessions, f"regent-{index}")
            await through_regent(unpinged_timings, unpinged_sessions, f"unpinged-{index}")
            if index >= warmup:
                measured.append(index)
    finally:
        floor_task.cancel()
        await asyncio.gather(floor_task, return_exceptions=True)
        await enqueuer.close()
        await watcher.close()
        await scheduler.stop()
        await database.dispose()
        await unpinged.dispose()
    load_after = os.getloadavg()
    print(
        f"\nenqueue -> delivery, {events} single messages each (after {warmup} warm-up),"
        f" alternating; load average before {load_before[0]:.2f} / after {load_after[0]:.2f}"
        f" ({os.cpu_count()} cores); ms"
    )
    print(f"{'path':<74} {'p50':>7} {'p95':>7} {'mean':>7}")
    rows = {}
    for label, prefix, timings in (
        ("floor: asyncpg INSERT+NOTIFY / LISTEN + claim UPDATE", "floor", floor_timings),
        ("Regent: Outbox.enqueue / NOTIFY wake-up + drain", "regent", regent_timings),
        ("Regent, enqueue through an engine without pre-ping", "unpinged", unpinged_timings),
    ):
        from_start, from_commit = timings.figures([f"{prefix}-{i}" for i in measured])
        rows[prefix] = (from_start, from_commit)
        for part, values in (("enqueue start", from_start), ("commit", from_commit)):
            print(
                f"{label + ', from ' + part:<74}"
                f" {percentile(values, 0.5) * 1000:>7.2f} {percentile(values, 0.95) * 1000:>7.2f}"
                f" {statistics.fmean(values) * 1000:>7.2f}"
            )
    for prefix in ("regent", "unpinged"):
        for column, part in enumerate(("enqueue start", "commit")):
            gap = percentile(rows[prefix][column], 0.5) - percentile(rows["floor"][column], 0.5)
            print(f"{prefix + ' p50 - floor p50, from ' + part:<74} {gap * 1000:>7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=30)
    args = parser.parse_args()
    with migrated_database() as url:
        asyncio.run(_run(url, args.events, args.warmup))


if __name__ == "__main__":
    main()
