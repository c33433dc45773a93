"""A hint names the command as the user typed it: started as `python -m regent` (a
project of one's own), every hint that names a command says `python -m regent`, never
this repository's `python -m app`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
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


def test_a_server_worker_of_python_m_regent_names_python_m_regent(
    tmp_path: Path, database_url: str
) -> None:
    # A uvicorn worker is a spawned process: its main module is not `regent.__main__`.
    port = free_port()
    token = "admin-token-0123456789abcdef0123456789"
    env = os.environ | {"DATABASE_URL": database_url, "ADMIN_TOKEN": token}
    with open(tmp_path / "stderr.txt", "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "regent", "--port", str(port), "--workers", "2"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                answer = httpx.get(
                    f"http://127.0.0.1:{port}/admin/api/jobs/no_such_job/runs",
                    headers={"Authorization": f"Bearer {token}"},
                )
                break
            except httpx.TransportError:
                assert server.poll() is None, (tmp_path / "stderr.txt").read_text()
                assert time.monotonic() < deadline, "the server did not answer within 60 s"
                time.sleep(0.2)
        assert answer.status_code == 404, answer.text
        assert "`python -m regent jobs" in answer.text, answer.text
    finally:
        server.terminate()
        server.wait(timeout=30)
