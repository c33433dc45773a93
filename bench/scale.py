"""Many jobs: what 100, 1,000 and 10,000 registered leader jobs cost, beside none.

For each job count (mixed hourly intervals and daily crons, plus a 1 s probe job) a
leader process and a standby process run on a fresh copy of a migrated database:

- promotion to first fire: from the leader's start to the probe's first body (its slot
  is due at registration), on an empty table (first boot) and again by a second leader
  once the rows exist (a failover); the handover grace is 0 here, add yours;
- RSS of the leader over the probe-only leader (the no-job baseline);
- CPU seconds per second of the leader and of an idle standby over the window;
- per-fire overhead: the probe's lateness (body start minus slot) over the window.

Then the thundering slot: 1,000 jobs on cron('* * * * *'), the lateness of the LAST
body of each minute to start, beside a lone job on the same cron in the same run.

    python bench/scale.py [--quick] [--window 60] [--minutes 3] [--counts 0,10000]

``--minutes 0`` skips the thundering slot; ``--profile DIR`` writes a cProfile of each
leader process there (``leader-<jobs>-<boot|failover>.prof``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from _server import migrated_database, percentile
from sqlalchemy.engine import make_url

from app.db import Database, asyncpg_dsn
from app.scheduler import JobContext, Role, Scheduler, SchedulerConfig, cron, every

_COUNTS = (0, 100, 1_000, 10_000)
_CROWD = 1_000
_HOLD_SECONDS = 10.0


def _scheduler(jobs: int, on_probe: Any) -> Scheduler:
    scheduler = Scheduler()

    async def noop(ctx: JobContext) -> None:
        return None

    for index in range(jobs):
        # Mixed and spread out, as an application's jobs are; none is due in the window.
        trigger = (
            every(hours=1 + index % 23) if index % 2 else cron(f"{index % 60} {index % 24} * * *")
        )
        scheduler.job(trigger, id=f"job-{index:05d}")(noop)

    async def probe(ctx: JobContext) -> None:
        on_probe(ctx.scheduled_at)

    scheduler.job(every(seconds=1), id="probe", first_run=0)(probe)
    return scheduler


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def _start(scheduler: Scheduler, database: Database) -> None:
    await scheduler.start(
        SchedulerConfig(lock_dsn=asyncpg_dsn(database.url), handover_grace_seconds=0),
        engine=database.engine,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
    )


async def _leader(url: str, jobs: int, window: float) -> dict[str, Any]:
    """Lead with ``jobs`` jobs: promotion to first fire, then the window's figures."""
    lateness: list[float] = []
    fired = asyncio.Event()

    def on_probe(slot: datetime) -> None:
        lateness.append((datetime.now(UTC) - slot).total_seconds())
        fired.set()

    scheduler = _scheduler(jobs, on_probe)
    database = Database.from_url(url)
    started = time.perf_counter()
    await _start(scheduler, database)
    assert scheduler.supervisor is not None
    await scheduler.supervisor.wait_for_role(Role.LEADER, timeout=60)
    promoted = time.perf_counter()
    await asyncio.wait_for(fired.wait(), 60)
    first_fire = time.perf_counter()
    print("leading", flush=True)
    lateness.clear()
    cpu = _cpu()
    await asyncio.sleep(window)
    cpu = _cpu() - cpu
    rss = _rss_mb()
    # Outlast the standby's window, which began later: it must not promote inside it.
    await asyncio.sleep(_HOLD_SECONDS if window else 0)
    await scheduler.stop()
    await database.dispose()
    return {
        "start_to_fire": first_fire - started,
        "promoted_to_fire": first_fire - promoted,
        "rss_mb": rss,
        "cpu_per_s": cpu / window if window else 0.0,
        "lateness": lateness,
    }


async def _standby(url: str, jobs: int, window: float) -> dict[str, Any]:
    """Wait for the key with ``jobs`` jobs registered; the window's CPU."""
    scheduler = _scheduler(jobs, lambda slot: None)
    database = Database.from_url(url)
    await _start(scheduler, database)
    assert scheduler.supervisor is not None
    await scheduler.supervisor.wait_for_role(Role.STANDBY, timeout=60)
    cpu = _cpu()
    await asyncio.sleep(window)
    cpu = _cpu() - cpu
    await scheduler.stop()
    await database.dispose()
    return {"cpu_per_s": cpu / window}


async def _crowd(url: str, jobs: int, minutes: int) -> dict[str, Any]:
    """``jobs`` jobs on the same cron minute: the lateness of each minute's last body."""
    starts: dict[datetime, list[float]] = {}
    done = asyncio.Event()
    scheduler = Scheduler()

    async def body(ctx: JobContext) -> None:
        late = (datetime.now(UTC) - ctx.scheduled_at).total_seconds()
        starts.setdefault(ctx.scheduled_at, []).append(late)
        if sum(len(values) == jobs for values in starts.values()) >= minutes:
            done.set()

    for index in range(jobs):
        scheduler.job(cron("* * * * *"), id=f"crowd-{index:05d}")(body)
    database = Database.from_url(url)
    await _start(scheduler, database)
    assert scheduler.supervisor is not None
    await scheduler.supervisor.wait_until_firing(timeout=60)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), 60 * minutes + 65)
    await scheduler.stop()
    await database.dispose()
    complete = [values for values in starts.values() if len(values) == jobs]
    return {
        "last": [max(values) for values in complete],
        "first": [min(values) for values in complete],
        "all": [late for values in complete for late in values],
    }


def _child(args: argparse.Namespace) -> None:
    if args.child == "leader" and args.profile:
        import cProfile

        profile = cProfile.Profile()
        result = profile.runcall(asyncio.run, _leader(args.url, args.jobs, args.window))
        kind = "boot" if args.window else "failover"
        profile.dump_stats(Path(args.profile) / f"leader-{args.jobs}-{kind}.prof")
    elif args.child == "leader":
        result = asyncio.run(_leader(args.url, args.jobs, args.window))
    elif args.child == "standby":
        result = asyncio.run(_standby(args.url, args.jobs, args.window))
    else:
        result = asyncio.run(_crowd(args.url, args.jobs, args.minutes))
    print(json.dumps(result), flush=True)


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )


def _result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = process.communicate(timeout=900)
    if process.returncode != 0:
        raise RuntimeError(f"a bench process failed ({process.returncode}): {out[-2000:]}")
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _copy(url: str) -> str:
    """A fresh database cloned from the migrated one at ``url``."""
    name = f"scale_{uuid.uuid4().hex[:8]}"
    # The URL may name the server by a socket directory in its query (host=...).
    parsed = make_url(url)
    admin = parsed.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{parsed.database}"'.encode())
    return parsed.set(database=name).render_as_string(hide_password=False)


def _counts(
    url: str, window: float, counts: tuple[int, ...], profile: str | None
) -> dict[int, dict[str, Any]]:
    results: dict[int, dict[str, Any]] = {}
    for jobs in counts:
        copy = _copy(url)
        common: tuple[str, ...] = ("--url", copy, "--jobs", str(jobs), "--window", str(window))
        if profile:
            common += ("--profile", profile)
        leader = _spawn("--child", "leader", *common)
        assert leader.stdout is not None
        if leader.stdout.readline().strip() != "leading":
            raise RuntimeError(f"the leader with {jobs} jobs did not start: {_result(leader)}")
        standby = _spawn("--child", "standby", *common)
        first = _result(leader)
        idle = _result(standby)
        # Once the rows exist: a failover's promotion, with the probe due at once.
        with psycopg.connect(copy, autocommit=True) as conn:
            conn.execute(b"UPDATE scheduler_jobs SET next_run_at = now() WHERE id = 'probe'")
        again = _result(_spawn("--child", "leader", *common[:4], *common[6:], "--window", "0"))
        results[jobs] = {"first": first, "standby": idle, "again": again}
        print(f"  measured {jobs} jobs", file=sys.stderr)
    return results


def _ms(values: list[float], fraction: float) -> str:
    return f"{percentile(values, fraction) * 1000:.1f}" if values else "-"


def _report_counts(results: dict[int, dict[str, Any]], window: float) -> None:
    base = results[min(results)]["first"]
    print(f"\nleader jobs, window {window:g} s, handover grace 0 s (add yours), 1 s probe job")
    print(
        f"{'jobs':>6} {'boot->fire s':>13} {'failover->fire s':>17} {'RSS MB':>7}"
        f" {'+RSS MB':>8} {'leader cpu':>11} {'standby cpu':>12}"
        f" {'probe p50 ms':>13} {'probe p99 ms':>13} {'fires':>6}"
    )
    for jobs, figures in results.items():
        first, again = figures["first"], figures["again"]
        print(
            f"{jobs:>6} {first['promoted_to_fire']:>13.3f} {again['promoted_to_fire']:>17.3f}"
            f" {first['rss_mb']:>7.1f} {first['rss_mb'] - base['rss_mb']:>8.1f}"
            f" {first['cpu_per_s']:>11.4f} {figures['standby']['cpu_per_s']:>12.4f}"
            f" {_ms(first['lateness'], 0.5):>13} {_ms(first['lateness'], 0.99):>13}"
            f" {len(first['lateness']):>6}"
        )
    print(
        "  (cpu: CPU seconds per second of the process; +RSS is over the smallest count, "
        "0 being the probe-only baseline)"
    )


def _report_crowd(lone: dict[str, Any], crowd: dict[str, Any], minutes: int) -> None:
    print(
        f"\nthundering slot: cron('* * * * *'), {minutes} minute(s), "
        f"claim_ahead_seconds={SchedulerConfig.claim_ahead_seconds} (the default); lateness in ms"
    )
    print(f"{'':<34} {'minutes':>8} {'p50':>8} {'p99':>8} {'max':>8}")
    rows = {
        "lone job (baseline)": lone["last"],
        f"{_CROWD} jobs: first body of the minute": crowd["first"],
        f"{_CROWD} jobs: every body": crowd["all"],
        f"{_CROWD} jobs: LAST body of the minute": crowd["last"],
    }
    for label, values in rows.items():
        count = len(lone["last"]) if label.startswith("lone") else len(crowd["last"])
        top = f"{max(values) * 1000:.1f}" if values else "-"
        print(f"{label:<34} {count:>8} {_ms(values, 0.5):>8} {_ms(values, 0.99):>8} {top:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="10 s windows, 1 cron minute")
    parser.add_argument("--window", type=float, default=60)
    parser.add_argument("--minutes", type=int, default=3, help="0 skips the thundering slot")
    parser.add_argument(
        "--counts",
        default=",".join(map(str, _COUNTS)),
        help="comma-separated leader job counts (default %(default)s)",
    )
    parser.add_argument("--profile", metavar="DIR", help="cProfile each leader process into DIR")
    parser.add_argument("--child", choices=("leader", "standby", "crowd"), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--jobs", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    window, minutes = (10.0, min(1, args.minutes)) if args.quick else (args.window, args.minutes)
    job_counts = tuple(int(count) for count in args.counts.split(","))
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        args.profile = str(Path(args.profile).resolve())
    with migrated_database() as url:
        counts = _counts(url, window, job_counts, args.profile)
        if not minutes:
            _report(counts, window)
            return
        lone = _result(
            _spawn(
                "--child", "crowd", "--url", _copy(url), "--jobs", "1", "--minutes", str(minutes)
            )
        )
        crowd = _result(
            _spawn(
                "--child",
                "crowd",
                "--url",
                _copy(url),
                "--jobs",
                str(_CROWD),
                "--minutes",
                str(minutes),
            )
        )
    _report(counts, window)
    _report_crowd(lone, crowd, minutes)


def _report(counts: dict[int, dict[str, Any]], window: float) -> None:
    print(f"\nload average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; 2 cores")
    _report_counts(counts, window)


if __name__ == "__main__":
    main()
