"""A hint names the command as the user typed it: started as `python -m regent` (a
project of one's own), every hint that names a command says `python -m regent`, never
this repository's `python -m app`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.localpg import free_port


@pytest.mark.parametrize(
    ("arguments", "hint"),
    [
        (["outbox", "reset", "reminders"], "`python -m regent outbox reset NAME`"),
        (["jobs"], "start `python -m regent` once as this user"),
    ],
    ids=["usage", "no-server"],
)
def test_a_hint_of_python_m_regent_names_python_m_regent(
    tmp_path: Path, arguments: list[str], hint: str
) -> None:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env |= {"REGENT_DATA_DIR": str(tmp_path / "data"), "REGENT_PG_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "regent", *arguments],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert hint in done.stderr, done.stderr
    assert "python -m app" not in done.stderr, done.stderr
