"""The CLI finds the app's Scheduler and the schedule that app really runs, through the
middleware shapes users write; when it cannot, it says what to do in one line."""

from __future__ import annotations

import argparse

import pytest

from app.app_target import AppTargetError, load_scheduler
from app.cli_admin import schedule_of
from app.settings import load_settings


def _schedule_of(app: str, *, environment_name: str) -> str:
    settings = load_settings(_env_file=None, SCHEDULER_NAME=environment_name)
    return schedule_of(argparse.Namespace(schedule=None, app=app), settings)


def test_the_cli_acts_on_the_schedule_name_the_app_was_built_with_not_the_environments() -> None:
    assert _schedule_of("tests.procs.settings_named_app:app", environment_name="other") == "ledger"


@pytest.mark.parametrize("attribute", ["closure", "marked", "nested"])
def test_the_scheduler_is_found_inside_closure_middleware(attribute: str) -> None:
    target = f"tests.procs.wrapped_apps:{attribute}"
    assert load_scheduler(target, "--app").scheduler.name == "wrapped"
    assert _schedule_of(target, environment_name="other") == "wrapped"


def test_middleware_that_hides_the_app_fails_in_one_line_naming_the_fixes() -> None:
    target = "tests.procs.wrapped_apps:opaque"
    with pytest.raises(AppTargetError) as raised:
        load_scheduler(target, "--app")
    message = str(raised.value)
    assert "\n" not in message
    assert target in message
    assert "--schedule" in message and ".app" in message and "functools.wraps" in message


def test_an_app_that_wraps_two_schedulers_is_refused_naming_both_and_the_schedule_option() -> None:
    target = "tests.procs.wrapped_apps:two_schedules"
    with pytest.raises(AppTargetError) as raised:
        load_scheduler(target, "--app")
    message = str(raised.value)
    assert target in message and "other, wrapped" in message and "--schedule" in message


def test_serve_accepts_an_app_that_dispatches_to_two_regent_apps() -> None:
    from app.__main__ import _app_target

    target = "tests.procs.wrapped_apps:two_schedules"
    assert _app_target(argparse.Namespace(app=target), load_settings(_env_file=None)) == target
