"""Plain `uvicorn app.main:app` that cannot start says why in one line and exits non-zero.

Start-up refuses a database it cannot use (DATABASE_URL unset, a server that does not
answer, a schema behind head). Under uvicorn, an exception out of the lifespan is printed
as a forty-line traceback through starlette's and FastAPI's frames, with the message
at its very end: the operator reads one line naming the variable, the database and the
fix instead.
"""

import os
import subprocess
import sys

import pytest
from sqlalchemy.engine import make_url

from app.localpg import free_port


def _serve(database_url: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    env["DATABASE_CONNECT_TIMEOUT_SECONDS"] = "3"
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return subprocess.run(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _error_lines(served: subprocess.CompletedProcess[str]) -> list[str]:
    # uvicorn's own INFO lines (server process, waiting for start-up) and its closing
    # "Application startup failed. Exiting." are uvicorn's; what Regent adds is the rest.
    return [
        line
        for line in served.stderr.splitlines()
        if line.strip()
        and not line.startswith("INFO:")
        and "Application startup failed" not in line
    ]


def _assert_one_line(served: subprocess.CompletedProcess[str], *names: str) -> str:
    assert served.returncode != 0
    assert "Traceback" not in served.stderr
    lines = _error_lines(served)
    assert len(lines) == 1, served.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def test_plain_uvicorn_with_database_url_unset_fails_in_one_line() -> None:
    _assert_one_line(_serve(None), "DATABASE_URL", "python -m app")


def test_plain_uvicorn_with_a_database_url_nobody_answers_fails_in_one_line() -> None:
    port = free_port()
    _assert_one_line(
        _serve(f"postgresql://u:p@127.0.0.1:{port}/app"),
        "DATABASE_URL",
        f"127.0.0.1:{port}/app",
    )


@pytest.mark.usefixtures("pg_server")
def test_plain_uvicorn_on_an_unmigrated_database_fails_in_one_line(
    empty_database_url: str,
) -> None:
    database = make_url(empty_database_url).database
    _assert_one_line(
        _serve(empty_database_url), "DATABASE_URL", f"/{database}", "python -m app migrate"
    )
