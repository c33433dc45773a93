"""Prometheus metrics, correct across uvicorn workers.

With PROMETHEUS_MULTIPROC_DIR set (``python -m app serve`` sets it), every worker
writes its samples to that directory and ``GET /metrics`` on any worker aggregates all
of them: job series come from the leader's process whichever worker answers. A worker
that died without a clean exit (SIGKILL) is forgotten at the next scrape, so the leader
gauge counts live processes only. Without it
(plain uvicorn) each worker reports only itself. Outbox series are read from the
database at scrape time, so they are the same from every worker; they read the live
rows (pending, stuck) and the last hour's per-minute delivery counts the database keeps
(outbox_delivered_minutes), never a delivered row, so a scrape costs the same with a
million delivered rows kept or delivered in the last hour.

The series and what feeds them live here; the scrape (``GET /metrics``) is
metrics_route.py, so that what counts (the retention job, the CLI's prune) does not
import the web framework.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

from prometheus_client import Counter, Gauge, Histogram, multiprocess

from .scheduler import RunFinished, Scheduler

__all__ = [
    "RETENTION_REMOVED",
    "forget_dead_workers",
    "instrument",
    "measure_loop_lag",
]

JOB_RUNS = Counter("regent_job_runs", "Slots run or skipped, by outcome", ["job", "status"])
JOB_DURATION = Histogram("regent_job_duration_seconds", "Job body duration", ["job"])
JOB_LATENESS = Histogram(
    "regent_job_lateness_seconds",
    "Body start minus the slot's due time",
    ["job"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)
IS_LEADER = Gauge(
    "regent_is_leader",
    "1 in the process that leads (summed over live workers)",
    multiprocess_mode="livesum",
)
LEADER_CHANGES = Counter("regent_leader_changes", "Promotions of this deployment's workers")
RETENTION_REMOVED = Counter(
    "regent_retention_removed",
    "Rows the regent_retention job deleted, by table",
    ["table"],
)
LOOP_LAG = Gauge(
    "regent_event_loop_lag_seconds",
    "Worst event-loop lag in the last second, over workers",
    multiprocess_mode="livemax",
)


def instrument(scheduler: Scheduler) -> None:
    """Feed the scheduler's runs and role changes into the metrics above."""

    def on_run(event: RunFinished) -> None:
        JOB_RUNS.labels(event.job_id, event.status).inc()
        if event.status not in ("missed", "skipped_overlap"):
            JOB_DURATION.labels(event.job_id).observe(event.duration_seconds)
            JOB_LATENESS.labels(event.job_id).observe(event.lateness_seconds)

    def on_role(role: str) -> None:
        leading = role in ("leader", "unguarded")
        IS_LEADER.set(1 if leading else 0)
        if leading:
            LEADER_CHANGES.inc()

    scheduler.observe(on_run=on_run, on_role=on_role)


async def measure_loop_lag(interval: float = 0.1, window: float = 1.0) -> None:
    """Sample this worker's loop lag every ``interval``; publish the worst per window.

    Runs until cancelled (the lifespan owns it).
    """
    worst, window_end = 0.0, time.monotonic() + window
    while True:
        due = time.monotonic() + interval
        await asyncio.sleep(interval)
        worst = max(worst, time.monotonic() - due)
        if time.monotonic() >= window_end:
            LOOP_LAG.set(worst)
            worst, window_end = 0.0, time.monotonic() + window


_SAMPLE_FILE = re.compile(r"^gauge_live\w*?_(\d+)\.db$")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs on this host (a zombie, killed but not reaped, is dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return ") Z " not in stat


def forget_dead_workers(directory: str) -> list[int]:
    """Drop the live gauges (leader, loop lag) of workers that died without a clean exit
    (SIGKILL, OOM), so a dead leader no longer counts. Returns the pids forgotten.

    Counters and histograms of dead workers stay: what they counted did happen.
    """
    dead = {
        int(match.group(1))
        for name in os.listdir(directory)
        if (match := _SAMPLE_FILE.match(name)) and not _alive(int(match.group(1)))
    }
    for pid in dead:
        multiprocess.mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    return sorted(dead)
