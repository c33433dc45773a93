"""An embedded data directory holds one project's database: the default one is shared
by every project of a user (as root by every project on the machine), so a second
project started on it is refused in one line naming both projects and
REGENT_DATA_DIR, instead of migrating, retiring the jobs of, and serving the first's.
The project is found as its migrations are, from the working directory up."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.localpg import free_port


def _migrate(cwd: Path, data_dir: Path) -> subprocess.CompletedProcess[str]:
    """`python -m regent migrate` in ``cwd`` on the embedded server of ``data_dir``."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env |= {"REGENT_DATA_DIR": str(data_dir), "REGENT_PG_PORT": str(free_port())}
    return subprocess.run(
        [sys.executable, "-m", "regent", "migrate"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _project(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "pyproject.toml").write_text(f'[project]\nname = "{path.name}"\n')
    return path.resolve()


def test_a_second_project_is_refused_the_data_directory_of_the_first(
    tmp_path: Path, reachable_dir: Path
) -> None:
    first, second = _project(tmp_path / "first"), _project(tmp_path / "second")
    data_dir = reachable_dir / "regent"
    assert _migrate(first, data_dir).returncode == 0

    refused = _migrate(second, data_dir)

    assert refused.returncode != 0, refused.stderr
    [line] = [line for line in refused.stderr.splitlines() if "error" in line]
    assert str(first) in line and str(second) in line and "REGENT_DATA_DIR" in line, line


def test_a_project_run_from_its_subdirectory_keeps_its_data_directory(
    tmp_path: Path, reachable_dir: Path
) -> None:
    project = _project(tmp_path / "mine")
    (inside := project / "src" / "mine").mkdir(parents=True)
    data_dir = reachable_dir / "regent"
    assert _migrate(project, data_dir).returncode == 0

    again = _migrate(inside, data_dir)

    assert again.returncode == 0, again.stderr
