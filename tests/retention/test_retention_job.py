"""The regent_retention job: every app has it, leader-only; it reports what it removed
(log action, metrics); `python -m app prune --dry-run` says what would go; its
settings are refused outside their bounds, by name."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys

import pytest
from prometheus_client import REGISTRY

from app.db import Database
from app.main import create_app
from app.retention import RETENTION_JOB_ID
from app.scheduler import Scheduler, SystemClock
from app.settings import Settings, SettingsError, load_settings
from app.testing import run_job

from .conftest import DAY, History


def _removed(table: str) -> float:
    return REGISTRY.get_sample_value("regent_retention_removed_total", {"table": table}) or 0.0


def test_every_app_built_with_create_app_has_the_leader_only_retention_job(
    settings: Settings,
) -> None:
    scheduler = Scheduler()
    create_app(settings, scheduler)
    # Built twice on one scheduler (tests do): still one job, no duplicate-id error.
    create_app(settings, scheduler)
    assert scheduler.jobs[RETENTION_JOB_ID].leader_only


def test_an_app_with_retention_off_has_no_retention_job(settings: Settings) -> None:
    scheduler = Scheduler()
    create_app(settings.model_copy(update={"RETENTION_ENABLED": False}), scheduler)
    assert RETENTION_JOB_ID not in scheduler.jobs


async def test_a_retention_run_logs_and_counts_what_it_removed(
    settings: Settings,
    database: Database,
    history: History,
    caplog: pytest.LogCaptureFixture,
) -> None:
    for n in range(3):
        await history.run("busy", age=(60 - n) * DAY)
    await history.message("mails", "old", age=30 * DAY)
    scheduler = Scheduler()
    create_app(settings.model_copy(update={"RUN_HISTORY_KEEP": 1}), scheduler)
    runs_before, rows_before = _removed("scheduler_runs"), _removed("outbox_messages")
    with caplog.at_level(logging.INFO, logger="app.retention"):
        record = await run_job(scheduler, RETENTION_JOB_ID, database=database, clock=SystemClock())
    assert record.status == "ok", record.error
    [line] = [r for r in caplog.records if getattr(r, "action", None) == "retention.pruned"]
    assert (line.runs, line.delivered) == (2, {"mails": 1})  # type: ignore[attr-defined]
    assert line.job_id == RETENTION_JOB_ID  # type: ignore[attr-defined]
    assert _removed("scheduler_runs") - runs_before == 2
    assert _removed("outbox_messages") - rows_before == 1


async def test_prune_dry_run_prints_what_would_go_and_deletes_nothing(
    database_url: str, history: History
) -> None:
    for n in range(3):
        await history.run("busy", age=(60 - n) * DAY)
    await history.message("mails", "old", age=30 * DAY)
    before = (await history.run_ids(), await history.message_ids())
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "app", "prune", "--dry-run"],
        env={**os.environ, "DATABASE_URL": database_url, "RUN_HISTORY_KEEP": "1"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    runs_line, outbox_line = result.stdout.strip().splitlines()
    assert runs_line.startswith("schedule default: would delete 2 run(s)")
    assert outbox_line.startswith("outbox 'mails': would delete 1 row(s)")
    assert (await history.run_ids(), await history.message_ids()) == before


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RUN_HISTORY_DAYS", 0),
        ("RUN_HISTORY_DAYS", 36501),
        ("RUN_HISTORY_KEEP", 0),
        ("OUTBOX_DELIVERED_DAYS", 0),
        ("OUTBOX_DELIVERED_DAYS", "a week"),
    ],
)
def test_a_retention_setting_out_of_bounds_is_refused_by_name(name: str, value: object) -> None:
    with pytest.raises(SettingsError, match=f"invalid setting {name}="):
        load_settings(_env_file=None, **{name: value})
