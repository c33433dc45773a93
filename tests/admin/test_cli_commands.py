"""`python -m app jobs | outbox | leader`: tables, and bad input that exits non-zero."""

import os
import subprocess
import sys

import psycopg
import pytest


def _app(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def seeded(database_url: str) -> str:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
            " VALUES ('nightly', 'Nightly sweep', 'cron ''0 3 * * *'' UTC', now())"
        )
        conn.execute(
            "INSERT INTO outbox_messages (id, outbox, key, payload, status, attempts,"
            " next_attempt_at, created_at, updated_at, last_error) OVERRIDING SYSTEM VALUE"
            " VALUES (41, 'grants', 'g-1', '{}', 'stuck', 24, now(), now(), now(), 'HTTP 400')"
        )
        # Row 42 is being delivered: a drain's claim on it runs for another hour.
        conn.execute(
            "INSERT INTO outbox_messages (id, outbox, key, payload, status, attempts,"
            " next_attempt_at, created_at, updated_at, claimed_by) OVERRIDING SYSTEM VALUE"
            " VALUES (42, 'grants', 'g-2', '{}', 'pending', 0, now() + interval '1 hour',"
            " now(), now(), gen_random_uuid())"
        )
    return database_url


def test_jobs_prints_a_table(seeded: str) -> None:
    result = _app(seeded, "jobs")
    assert result.returncode == 0, result.stderr
    assert "nightly" in result.stdout and "Nightly sweep" in result.stdout


def test_jobs_run_queues_the_job(seeded: str) -> None:
    result = _app(seeded, "jobs", "run", "nightly")
    assert result.returncode == 0, result.stderr
    assert "queued" in result.stdout


def test_history_of_an_unknown_job_names_it(seeded: str) -> None:
    result = _app(seeded, "jobs", "history", "nope")
    assert result.returncode == 1
    assert "no job with id 'nope'" in result.stderr


def test_outbox_stuck_and_reset(seeded: str) -> None:
    stuck = _app(seeded, "outbox", "stuck", "grants")
    assert "g-1" in stuck.stdout and "HTTP 400" in stuck.stdout
    reset = _app(seeded, "outbox", "reset", "grants", "41")
    assert reset.returncode == 0, reset.stderr
    assert _app(seeded, "outbox", "stuck").stdout.strip() == "no stuck rows"


def test_reset_of_a_row_a_drain_holds_prints_one_line_and_exits_non_zero(seeded: str) -> None:
    result = _app(seeded, "outbox", "reset", "grants", "42")
    assert result.returncode == 1
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "message 42 is being delivered" in line and "wait for the drain" in line


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["outbox", "reset", "grants", "999"], 1, "has no message 999"),
        (["outbox", "reset", "nope", "41"], 1, "no outbox named 'nope'"),
        (["outbox", "reset", "grants", "abc"], 2, "invalid int value: 'abc'"),
        (["jobs", "history", "nightly", "--limit", "0"], 2, "--limit: 0 is not between 1 and 500"),
    ],
)
def test_bad_input_exits_non_zero_saying_what_was_wrong(
    seeded: str, args: list[str], code: int, message: str
) -> None:
    result = _app(seeded, *args)
    assert result.returncode == code
    assert message in result.stderr


def test_leader_without_one_says_so(seeded: str) -> None:
    result = _app(seeded, "leader")
    assert result.returncode == 0
    assert "no leader" in result.stdout
