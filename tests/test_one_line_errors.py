"""Process-level bad input gets one line that names the variable or argument and the
fix, a non-zero exit, and no stack: `python -m app`, its sub-commands, plain uvicorn."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.localpg import free_port
from app.testing import TestServer
from tests.forked_cli import run_app

PAST_INT64 = str(2**64)


def _run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return subprocess.run(
        argv, env=clean | env, capture_output=True, text=True, timeout=90, check=False
    )


def _app(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    return run_app(list(args), clean | env, timeout=90)


def assert_one_line_error(result: subprocess.CompletedProcess[str], *named: str) -> None:
    """Non-zero exit, no traceback, and the last stderr line is the error, naming each
    of ``named``; whatever came before it is informational (``regent: ...``)."""
    assert result.returncode != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines, "no error at all"
    error = lines[-1]
    assert error.startswith("regent: error: "), result.stderr
    for name in named:
        assert name in error, result.stderr
    assert all(line.startswith("regent: ") for line in lines), result.stderr


def test_plain_uvicorn_with_a_bad_setting_says_one_line() -> None:
    result = _run(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(free_port())],
        {"ENVIRONMENT": "prod", "DATABASE_URL": "postgresql://u@127.0.0.1:1/x"},
    )
    assert_one_line_error(result, "ENVIRONMENT")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_CONNECT_TIMEOUT_SECONDS", "inf"),
        ("REPORT_WARM_INTERVAL_MINUTES", "inf"),
        ("LEASE_SECONDS", "1e400"),
        ("DATABASE_URL", "postgresql://u@127.0.0.1:99999/app"),
        ("DATABASE_URL", "postgresql://u@127.0.0.1:5432/app?frobnicate=1"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(name: str, value: str) -> None:
    assert_one_line_error(_app("migrate", **{name: value}), name)


def test_a_data_dir_that_is_a_file_is_one_line() -> None:
    with tempfile.NamedTemporaryFile() as file:
        assert_one_line_error(_app("migrate", REGENT_DATA_DIR=file.name), "REGENT_DATA_DIR")


def test_a_data_dir_under_dev_null_is_one_line() -> None:
    result = _app("migrate", REGENT_DATA_DIR="/dev/null/regent")
    assert_one_line_error(result, "REGENT_DATA_DIR")


def test_migrate_against_an_unreachable_server_is_one_line() -> None:
    port = free_port()
    result = _app(
        "migrate",
        DATABASE_URL=f"postgresql://u:p@127.0.0.1:{port}/app",
        DATABASE_CONNECT_TIMEOUT_SECONDS="3",
    )
    assert_one_line_error(result, f"127.0.0.1:{port}", "DATABASE_URL")


def test_migrate_with_a_user_the_server_refuses_is_one_line(pg_server: TestServer) -> None:
    url = make_url(pg_server.url_for("postgres")).set(username="nobody_here", password="wrong")
    result = _app("migrate", DATABASE_URL=url.render_as_string(hide_password=False))
    assert_one_line_error(result, "DATABASE_URL", "nobody_here")
    assert ":wrong@" not in result.stderr


def test_migrate_of_an_unknown_database_is_one_line(pg_server: TestServer) -> None:
    url = pg_server.url_for("no_such_database_here")
    assert_one_line_error(_app("migrate", DATABASE_URL=url), "no_such_database_here")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--port", "70000"], "--port"),
        (["serve", "--port", "0"], "--port"),
        (["--workers", "0"], "--workers"),
        (["serve", "--workers", "-3"], "--workers"),
        (["jobs", "history", "report_warm", "--limit", PAST_INT64], "--limit"),
        (["outbox", "reset", "credit_grants", "x1"], "message_id"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it(args: list[str], named: str) -> None:
    assert_one_line_error(_app(*args, DATABASE_URL="postgresql://u@127.0.0.1:1/x"), named)


def test_an_id_past_int64_is_not_found_in_one_line(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
            " next_attempt_at, created_at, updated_at) VALUES ('credit_grants', 'g-1', '{}',"
            " 'stuck', 24, now(), now(), now())"
        )
    result = _app("outbox", "reset", "credit_grants", PAST_INT64, DATABASE_URL=database_url)
    assert_one_line_error(result, PAST_INT64)


def test_a_job_id_that_is_not_text_is_not_found_in_one_line(database_url: str) -> None:
    # An argv byte that is not UTF-8 arrives as a lone surrogate.
    result = subprocess.run(
        [sys.executable.encode(), b"-m", b"app", b"jobs", b"run", b"\xff\xfe"],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 2
    stderr = result.stderr.decode(errors="replace")
    assert "Traceback" not in stderr and "no job with id" in stderr


def test_migrate_succeeds_with_the_sslmode_a_hosting_provider_adds(database_url: str) -> None:
    with_sslmode = make_url(database_url).update_query_dict({"sslmode": "disable"})
    result = _app("migrate", DATABASE_URL=with_sslmode.render_as_string(hide_password=False))
    assert result.returncode == 0, result.stderr


PRODUCTION = {"ENVIRONMENT": "production", "DATABASE_URL": "postgresql://u@127.0.0.1:1/x"}


def test_plain_uvicorn_in_production_with_logging_gateways_says_one_line() -> None:
    result = _run(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(free_port())], PRODUCTION
    )
    assert_one_line_error(result, "LoggingSmsGateway", "JobDeps(", "BOOKING_REMINDERS_ENABLED")


def test_serving_in_production_with_logging_gateways_says_one_line() -> None:
    result = _app("--port", str(free_port()), **PRODUCTION)
    assert_one_line_error(result, "LoggingSmsGateway", "JobDeps(", "BOOKING_REMINDERS_ENABLED")
