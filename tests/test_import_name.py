"""Regent's import package is ``app``; in a project of one's own it is reached as
``regent``. A project whose own top-level ``app`` comes first on the path (FastAPI's
"Bigger Applications" layout, started from its root) cannot run Regent: `python -m
regent` and a start-up of the project's app each fail in one line that names the
project's ``app``, Regent's, and the fix. Where nothing shadows it, the ``regent`` name
runs Regent's command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import app
from app.localpg import free_port

# Regent's own `app`, the one the `regent` name must find.
REGENTS_APP = Path(app.__file__).resolve().parent
# Regent's `app` a regular package on the path, as a wheel installs it (an editable
# install's finder comes after the path, where a namespace `app/` wins anyway).
INSTALLED = {**os.environ, "PYTHONPATH": str(REGENTS_APP.parent)}


def _run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _assert_one_line_naming_both(done: subprocess.CompletedProcess[str], project: Path) -> None:
    assert done.returncode != 0, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert str(project.resolve() / "app") in lines[0], lines[0]
    assert str(REGENTS_APP) in lines[0], lines[0]
    assert "rename your own `app`" in lines[0], lines[0]


def test_python_m_regent_in_a_project_with_its_own_app_fails_in_one_line_naming_both(
    project_with_its_own_app: Path,
) -> None:
    done = _run(["-m", "regent", "jobs"], cwd=project_with_its_own_app)
    _assert_one_line_naming_both(done, project_with_its_own_app)


def test_python_m_regent_in_a_project_whose_app_has_no_init_fails_in_one_line_naming_both(
    project_with_its_own_namespace_app: Path,
) -> None:
    project = project_with_its_own_namespace_app
    done = _run(["-m", "regent", "--app", "app.main:app", "jobs"], cwd=project)
    _assert_one_line_naming_both(done, project)


def test_a_start_up_of_a_project_with_its_own_app_fails_in_one_line_naming_both(
    project_with_its_own_app: Path,
) -> None:
    done = _run(
        ["-m", "uvicorn", "app.main:app", "--port", str(free_port())],
        cwd=project_with_its_own_app,
    )
    _assert_one_line_naming_both(done, project_with_its_own_app)


def test_python_m_regent_runs_regents_command_line_where_nothing_shadows_app(
    tmp_path: Path,
) -> None:
    done = _run(["-m", "regent", "--help"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m regent "), done.stdout


def test_a_start_up_of_a_project_whose_app_has_no_init_fails_in_one_line_naming_both(
    project_with_its_own_namespace_app: Path,
) -> None:
    project = project_with_its_own_namespace_app
    command = ["-m", "uvicorn", "app.main:app", "--port", str(free_port())]
    done = _run(command, project, INSTALLED)
    _assert_one_line_naming_both(done, project)


def test_a_start_up_of_a_project_whose_app_holds_only_packages_fails_in_one_line_naming_both(
    project_with_its_own_namespace_app: Path,
) -> None:
    project = project_with_its_own_namespace_app
    package = project / "app" / "api"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (project / "app" / "main.py").rename(package / "routes.py")
    command = ["-m", "uvicorn", "app.api.routes:app", "--port", str(free_port())]
    done = _run(command, project, INSTALLED)
    _assert_one_line_naming_both(done, project)


def test_an_app_directory_of_test_modules_beside_the_project_is_not_taken_for_one(
    tmp_path: Path,
) -> None:
    (tmp_path / "tests" / "app").mkdir(parents=True)
    (tmp_path / "tests" / "app" / "test_views.py").write_text("def test_views():\n    pass\n")
    (tmp_path / "tests" / "test_top.py").write_text(
        "import regent\n\n\ndef test_top():\n    assert regent.create_app\n"
    )
    done = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], tmp_path, INSTALLED)
    assert done.returncode == 0, done.stdout + done.stderr
