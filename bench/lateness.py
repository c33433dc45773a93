"""How late jobs fire against their due time: a 1 s interval job and an every-minute
cron job, beside a bare asyncio.sleep loop aiming at whole seconds in the same loop.

Lateness is measured inside each body (wall clock at body start minus the slot), so it
includes the wait, the slot claim's commit and the hand-off to the body.

    python bench/lateness.py [--minutes 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime

from _server import migrated_database, percentile, start_leading

from app.db import Database
from app.scheduler import JobContext, Scheduler, cron, every


def _record(into: list[float], slot: datetime) -> None:
    into.append((datetime.now(UTC) - slot).total_seconds())


async def _baseline(into: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        due = float(int(time.time()) + 1)
        await asyncio.sleep(due - time.time())
        into.append(time.time() - due)


async def _measure(url: str, minutes: float) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"every(seconds=1)": [], "cron('* * * * *')": []}
    scheduler = Scheduler()

    @scheduler.job(every(seconds=1), id="every_second")
    async def every_second(ctx: JobContext) -> None:
        _record(results["every(seconds=1)"], ctx.scheduled_at)

    @scheduler.job(cron("* * * * *"), id="every_minute")
    async def every_minute(ctx: JobContext) -> None:
        _record(results["cron('* * * * *')"], ctx.scheduled_at)

    database = Database.from_url(url)
    await start_leading(scheduler, database)
    baseline: list[float] = []
    stop = asyncio.Event()
    sleeper = asyncio.create_task(_baseline(baseline, stop))
    await asyncio.sleep(minutes * 60)
    stop.set()
    await sleeper
    await scheduler.stop()
    await database.dispose()
    return {"asyncio.sleep loop (baseline)": baseline, **results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=5)
    args = parser.parse_args()
    with migrated_database() as url:
        results = asyncio.run(_measure(url, args.minutes))
    base = max(percentile(next(iter(results.values())), 0.99), 1e-6)
    print(f"\nlateness of the body start against the slot over {args.minutes:g} min; ms")
    print(f"{'timer':<30} {'fires':>6} {'p50':>7} {'p99':>7} {'max':>7} {'p99 x base':>11}")
    for label, values in results.items():
        if not values:
            print(f"{label:<30} {0:>6}")
            continue
        p99 = percentile(values, 0.99)
        print(
            f"{label:<30} {len(values):>6} {percentile(values, 0.5) * 1000:>7.2f}"
            f" {p99 * 1000:>7.2f} {max(values) * 1000:>7.2f} {p99 / base:>11.1f}"
        )


if __name__ == "__main__":
    main()
