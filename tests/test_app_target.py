"""--app names the app that is served and operated. `python -m app --app X` serves X
wherever the command line puts the option (`python -m app --app X serve` too, never
the built-in app instead), a user's own app on the embedded database with one worker
or several; the operator's commands find X's Scheduler and the schedule X really
runs, through the middleware shapes users write. A bad X fails in one line naming it
and saying what to do: a missing module or attribute, no app, no scheduler, two
schedulers, and an import that raises an error whose message spans lines (a pydantic
ValidationError of the user's own settings) or exits (SystemExit, another
BaseException) instead of raising an error."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.__main__ import _app_target, _parser
from app.app_target import AppTargetError, load_scheduler
from app.cli.options import schedule_of
from app.localpg import free_port
from app.settings import load_settings
from tests.forked_cli import run_app

from .conftest import ServeUserApp


def test_python_m_app_serves_a_users_own_app_on_the_embedded_database(
    serve_user_app: ServeUserApp,
) -> None:
    served = serve_user_app(workers=2)
    assert served.get("/hello").json() == {"from": "mypkg"}
    assert served.get("/readyz").status_code == 200


def test_python_m_app_serves_a_users_own_app_with_one_worker(
    serve_user_app: ServeUserApp,
) -> None:
    served = serve_user_app(workers=1)
    assert served.get("/hello").json() == {"from": "mypkg"}


def test_serve_accepts_a_regent_app_inside_asgi_middleware() -> None:
    target = "tests.procs.billing_app:wrapped"
    assert _app_target(argparse.Namespace(app=target), load_settings(_env_file=None)) == target


def test_serve_accepts_an_app_that_dispatches_to_two_regent_apps() -> None:
    target = "tests.procs.wrapped_apps:two_schedules"
    assert _app_target(argparse.Namespace(app=target), load_settings(_env_file=None)) == target


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


@pytest.mark.parametrize(
    "target",
    [
        "nosuch_module:app",
        "app.main:no_such_attribute",
        "app.settings:Settings",
        "tests.procs.unscheduled_app:plain",
        "tests.procs.unscheduled_app:unscheduled",
    ],
)
def test_a_bad_app_target_fails_in_one_line_naming_it(target: str) -> None:
    result = run_app(["--app", target, "--port", str(free_port())], dict(os.environ))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert target in result.stderr


def test_a_bad_app_given_before_serve_is_refused_not_replaced_by_the_built_in_app() -> None:
    args = _parser().parse_args(["--app", "nosuch_module:app", "serve"])
    with pytest.raises(AppTargetError, match="nosuch_module:app"):
        _app_target(args, load_settings(_env_file=None))


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


_SETTINGS_FAIL_AT_IMPORT = """
from pydantic import BaseModel


class MySettings(BaseModel):
    SMS_GATEWAY_URL: str


settings = MySettings()  # the variable is unset: ValidationError at import
app = None
"""


def _run_app_option(
    tmp_path: Path, source: str, *command: str, database_url: str | None = None
) -> subprocess.CompletedProcess[str]:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "main.py").write_text(source)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "app", *command, "--app", "mypkg.main:app"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_app_whose_import_raises_a_multi_line_error_fails_in_one_line(tmp_path: Path) -> None:
    result = _run_app_option(tmp_path, _SETTINGS_FAIL_AT_IMPORT)
    assert result.returncode == 2, result.stderr
    assert "mypkg.main:app" in result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


class _Exits:
    ZERO = "import sys\nsys.exit(0)\napp = None\n"
    MESSAGE = "raise SystemExit('DATABASE_URL is required')\napp = None\n"
    OTHER = "class Stop(BaseException):\n    pass\n\n\nraise Stop('stop')\napp = None\n"


@pytest.mark.parametrize("command", [[], ["jobs"]], ids=["serve", "jobs"])
@pytest.mark.parametrize(
    "source",
    [_Exits.ZERO, _Exits.MESSAGE, _Exits.OTHER],
    ids=["sys-exit-0", "system-exit-message", "base-exception"],
)
def test_an_app_whose_import_exits_fails_in_the_same_one_line(
    tmp_path: Path, source: str, command: list[str], database_url: str
) -> None:
    result = _run_app_option(tmp_path, source, *command, database_url=database_url)
    assert result.returncode == 2, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("regent: error: --app='mypkg.main:app': importing it raised"), line
