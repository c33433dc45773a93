"""The built-in app (``app.main:app``) is this repository's demo, whose tables are the
repository's own migrations: served from an installed Regent (which does not carry
them) it refuses in one line naming --app, instead of firing into a database without
its tables."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import app

REGENTS_APP = Path(app.__file__).resolve().parent


def test_the_demo_served_from_an_installed_regent_refuses_naming_the_app_option(
    tmp_path: Path,
) -> None:
    # Regent's package alone, as a wheel installs it: no repository around it.
    installed = tmp_path / "site-packages"
    shutil.copytree(REGENTS_APP, installed / "app", ignore=shutil.ignore_patterns("__pycache__"))
    project = tmp_path / "project"
    project.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", "from app.main import app"],
        cwd=project,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert "--app" in line
    assert "REGENT_APP" in line
