"""A bad --app fails in one line naming it, also when importing it raises an error
whose message spans lines (a pydantic ValidationError of the user's own settings), or
exits (SystemExit, another BaseException) instead of raising an error."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

USER_APP = """
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
    result = _run_app_option(tmp_path, USER_APP)
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
