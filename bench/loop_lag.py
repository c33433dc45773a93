"""Event-loop lag and request latency while a 250 ms sync database job runs every second.

One worker (uvicorn, in this process) serves /healthz to a client process (one request
every 5 ms, open loop) while the loop's lag is sampled every 5 ms on a fixed schedule and the
scheduler fires a job that runs `SELECT pg_sleep(0.25)` through the sync engine, three
ways: through asyncio.to_thread (how Regent runs sync jobs), called on the loop (the
reference's blocking sweep), and with no job at all (the baseline).

    python bench/loop_lag.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time

import uvicorn
from _server import migrated_database, percentile
from sqlalchemy import create_engine, text

from app.db import sync_url
from app.localpg import free_port
from app.main import create_app
from app.scheduler import JobContext, Scheduler, every
from app.settings import load_settings

SLEEP_SQL = text("SELECT pg_sleep(0.25)")
INTERVAL = 0.005

# The client runs in its own process, as a real one would: it does not compete with
# the server for the GIL. Open loop: latency counts from the intended send time, so a
# request held up behind a blocked loop delays (and is charged to) the ones after it.
CLIENT = """
import json, sys, time
import httpx
port, seconds = int(sys.argv[1]), float(sys.argv[2])
latencies = []
with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
    end = time.perf_counter() + seconds
    intended = time.perf_counter()
    while intended < end:
        http.get("/healthz")
        latencies.append(time.perf_counter() - intended)
        intended += 0.005
        time.sleep(max(0.0, intended - time.perf_counter()))
print(json.dumps(latencies))
"""
WARMUP_SECONDS = 2.5


def _in_thread_scheduler() -> Scheduler:
    scheduler = Scheduler()

    @scheduler.job(every(seconds=1), id="sync_in_thread")
    def sync_in_thread(ctx: JobContext) -> None:
        ctx.sync_session.execute(SLEEP_SQL)

    return scheduler


def _on_loop_scheduler(url: str) -> Scheduler:
    scheduler = Scheduler()
    engine = create_engine(sync_url(url))

    @scheduler.job(every(seconds=1), id="sync_on_loop")
    async def sync_on_loop(ctx: JobContext) -> None:
        # The defect under measurement: sync database work called from a coroutine.
        with engine.connect() as connection:
            connection.execute(SLEEP_SQL)

    return scheduler


async def _run(
    url: str, scheduler: Scheduler | None, seconds: float
) -> tuple[list[float], list[float]]:
    settings = load_settings(
        _env_file=None,
        DATABASE_URL=url,
        ENVIRONMENT="test",
        LOG_LEVEL="WARNING",
        HANDOVER_GRACE_SECONDS=0,
        LEASE_SECONDS=10,
        LEADER_TICK_SECONDS=1,
    )
    app = create_app(settings, scheduler)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for this
        await asyncio.sleep(0.01)

    # Warm up first: the first fires import drivers and open pool connections.
    await asyncio.sleep(WARMUP_SECONDS)
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, str(port), str(seconds), stdout=asyncio.subprocess.PIPE
    )
    # Lag on a fixed schedule: a 250 ms block makes every tick due inside it late.
    lags: list[float] = []
    deadline = time.monotonic() + seconds
    due = time.perf_counter()
    while time.monotonic() < deadline:
        due += INTERVAL
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        lags.append(max(0.0, time.perf_counter() - due))
    output, _ = await client.communicate()
    latencies: list[float] = json.loads(output)
    server.should_exit = True
    await serving
    return lags, latencies


def _row(label: str, lags: list[float], latencies: list[float], base: float) -> str:
    lag99 = percentile(lags, 0.99)
    return (
        f"{label:<22} {percentile(lags, 0.5) * 1000:>8.2f} {lag99 * 1000:>8.2f}"
        f" {max(lags) * 1000:>8.1f} {percentile(latencies, 0.5) * 1000:>9.2f}"
        f" {percentile(latencies, 0.99) * 1000:>9.2f} {max(latencies) * 1000:>9.1f}"
        f" {lag99 / base:>9.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10)
    args = parser.parse_args()
    with migrated_database() as url:
        results = {
            "no job (baseline)": asyncio.run(_run(url, None, args.seconds)),
            "to_thread (Regent)": asyncio.run(_run(url, _in_thread_scheduler(), args.seconds)),
            "on the loop (defect)": asyncio.run(_run(url, _on_loop_scheduler(url), args.seconds)),
        }
    base = max(percentile(results["no job (baseline)"][0], 0.99), 1e-6)
    print(
        f"\n250 ms sync DB job every 1 s, {args.seconds:g} s per mode after"
        f" {WARMUP_SECONDS:g} s warm-up; times in ms"
    )
    print(
        f"{'mode':<22} {'lag p50':>8} {'lag p99':>8} {'lag max':>8} {'req p50':>9}"
        f" {'req p99':>9} {'req max':>9} {'p99 x base':>9}"
    )
    for label, (lags, latencies) in results.items():
        print(_row(label, lags, latencies, base))


if __name__ == "__main__":
    main()
