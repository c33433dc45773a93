"""The line a promotion logs for the jobs it retires names the command to forget them as
the user runs Regent: `python -m regent jobs forget ID` in a project of one's own."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from app.invocation import COMMAND_VARIABLE
from app.scheduler import FakeClock

from ..conftest import release
from .conftest import StartScheduler


async def test_the_retired_jobs_line_of_python_m_regent_names_python_m_regent(
    start_scheduler: StartScheduler,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(COMMAND_VARIABLE, "python -m regent")
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    for each in (release("report", "old_report"), release("report")):
        supervisor = await start_scheduler(each, clock=clock)
        await supervisor.wait_until_firing()
        await each.stop()

    [line] = [r.getMessage() for r in caplog.records if r.msg.startswith("scheduler.jobs_retired")]
    assert "`python -m regent jobs forget ID`" in line, line
    assert "python -m app" not in line, line
