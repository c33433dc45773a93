"""Every hint names the command as the user typed it, beyond the CLI's usage lines:
the boot check's "run ... migrate", the psql command's way out, and the log line of a
retired job. Started as `python -m regent`, none says this repository's `python -m app`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.localpg import free_port


def _regent(cwd: Path, *arguments: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "regent", *arguments],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_boot_checks_fix_names_python_m_regent_migrate(
    tmp_path: Path, empty_database_url: str
) -> None:
    env = os.environ | {"DATABASE_URL": empty_database_url}

    done = _regent(tmp_path, "--port", str(free_port()), env=env)

    assert done.returncode != 0
    assert "run `python -m regent migrate`" in done.stderr, done.stderr
    assert "python -m app" not in done.stderr, done.stderr


def test_psql_without_a_client_names_python_m_regent_db_url(tmp_path: Path) -> None:
    # Server binaries without a psql beside them, and none on PATH.
    (bindir := tmp_path / "bin").mkdir()
    for name in ("postgres", "initdb"):
        (bindir / name).touch()
    env = os.environ | {
        "DATABASE_URL": "postgresql://someone@127.0.0.1:1/nothing",
        "PG_BINDIR": str(bindir),
        "PATH": str(tmp_path / "empty"),
    }

    done = _regent(tmp_path, "psql", env=env)

    assert done.returncode != 0
    assert "`python -m regent db-url`" in done.stderr, done.stderr
    assert "python -m app" not in done.stderr, done.stderr
