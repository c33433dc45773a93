"""`python -m app jobs | outbox | leader`: tables, and bad input that exits non-zero."""

import json
import os
import re
import socket
import subprocess
import sys

import psycopg
import pytest

from app.localpg import free_port
from tests.forked_cli import run_app


def _app(
    database_url: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return run_app(list(args), {**os.environ, "DATABASE_URL": database_url, **(env or {})})


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
    assert result.returncode == 2
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


TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "jobs.py", line 3, in sweep\n'
    "    charge()\n"
    "RuntimeError: gateway said no\n"
)


def _execute(database_url: str, sql: str, *params: object) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(sql, params)


@pytest.fixture
def with_runs(seeded: str) -> str:
    """Two runs of 'nightly': a scheduled one that failed, then a manual one."""
    for slot, status, error, manual in [
        ("2026-12-02 01:00:00.250+00", "error", TRACEBACK, False),
        ("2026-12-02 02:00:00+00", "ok", None, True),
    ]:
        _execute(
            seeded,
            "INSERT INTO scheduler_runs (job_id, scope, slot, manual, started_at, finished_at,"
            " status, lateness_ms, duration_ms, pid, host, error) VALUES ('nightly', 'leader',"
            " %s, %s, %s, %s, %s, 2, 0, 4242, 'web-1', %s)",
            slot,
            manual,
            slot,
            slot,
            status,
            error,
        )
    return seeded


def test_jobs_read_yes_no_timestamps_to_the_second_and_triggers_with_their_zone(
    seeded: str,
) -> None:
    _execute(seeded, "UPDATE scheduler_jobs SET next_run_at = '2026-12-02 15:47:37.5+00'")
    result = _app(seeded, "jobs")
    assert result.returncode == 0, result.stderr
    assert "True" not in result.stdout and "False" not in result.stdout
    assert re.search(r"\bno\b", result.stdout)
    assert "2026-12-02 15:47:37Z" in result.stdout and "+00:00" not in result.stdout
    assert "cron 0 3 * * * (UTC)" in result.stdout


def test_history_keeps_one_line_per_run_and_marks_manual_runs(with_runs: str) -> None:
    result = _app(with_runs, "jobs", "history", "nightly")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.strip().splitlines()
    assert "manual" in header
    assert len(rows) == 2
    newest, oldest = rows
    assert re.search(r"\byes\b", newest) and "0 ms" in newest
    assert "RuntimeError: gateway said no" in oldest and "Traceback" not in result.stdout
    assert "2026-12-02 01:00:00Z" in oldest


def test_history_full_prints_each_error_whole(with_runs: str) -> None:
    result = _app(with_runs, "jobs", "history", "nightly", "--full")
    assert result.returncode == 0, result.stderr
    indented = "\n".join(f"    {line}" for line in TRACEBACK.strip().split("\n"))
    assert indented in result.stdout


def test_jobs_pause_and_resume(seeded: str) -> None:
    paused = _app(seeded, "jobs", "pause", "nightly")
    assert paused.returncode == 0, paused.stderr
    assert "paused" in paused.stdout
    assert re.search(r"nightly .*\byes\s*$", _app(seeded, "jobs").stdout, re.MULTILINE)
    resumed = _app(seeded, "jobs", "resume", "nightly")
    assert resumed.returncode == 0, resumed.stderr
    assert re.search(r"nightly .*\bno\s*$", _app(seeded, "jobs").stdout, re.MULTILINE)


def test_pausing_an_unknown_job_names_it(seeded: str) -> None:
    result = _app(seeded, "jobs", "pause", "nope")
    assert result.returncode == 2
    assert "no job with id 'nope'" in result.stderr


def test_outbox_list_counts_each_outbox_per_status(seeded: str) -> None:
    result = _app(seeded, "outbox", "list")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.strip().splitlines()
    assert header.split()[:5] == ["outbox", "pending", "scheduled", "delivered_1h", "stuck"]
    # The seed: g-1 stuck, g-2 pending (held by a drain).
    assert row.split()[:5] == ["grants", "1", "0", "0", "1"]


def test_outbox_pending_lists_pending_rows_with_their_last_error(seeded: str) -> None:
    _execute(
        seeded,
        "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
        " created_at, updated_at, last_error) VALUES ('grants', 'g-3', '{}', 'pending', 3,"
        " now(), now(), now(), 'HTTP 503')",
    )
    result = _app(seeded, "outbox", "pending")
    assert result.returncode == 0, result.stderr
    assert "g-3" in result.stdout and "HTTP 503" in result.stdout
    assert "g-1" not in result.stdout


def test_outbox_without_a_subcommand_names_the_subcommands(seeded: str) -> None:
    result = _app(seeded, "outbox")
    assert result.returncode == 2
    for name in ("list", "pending", "stuck", "reset"):
        assert name in result.stderr
    assert "outbox_command" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["jobs"],
        ["jobs", "history", "nightly"],
        ["outbox", "list"],
        ["outbox", "stuck"],
        ["outbox", "pending"],
        ["leader"],
    ],
)
def test_every_read_command_prints_json_for_scripts(with_runs: str, args: list[str]) -> None:
    result = _app(with_runs, *args, "--json")
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)


def test_an_unreachable_embedded_server_names_regent_pg_port() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "app", "jobs"],
        env=env | {"REGENT_PG_PORT": str(free_port())},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "REGENT_PG_PORT" in result.stderr
    assert "Traceback" not in result.stderr


BILLING_APP = "tests.procs.billing_app:app"


@pytest.fixture
def two_reports(database_url: str) -> str:
    """Job 'report' in schedule default and in schedule billing."""
    for schedule in ("default", "billing"):
        _execute(
            database_url,
            "INSERT INTO scheduler_jobs (schedule, id, name, trigger, next_run_at)"
            " VALUES (%s, 'report', 'Report', 'every 1h', now())",
            schedule,
        )
    return database_url


def _paused(database_url: str) -> dict[str, bool]:
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute("SELECT schedule, paused FROM scheduler_jobs WHERE id = 'report'")
        return dict(rows.fetchall())


def test_jobs_pause_pauses_the_job_of_the_schedule_the_regent_app_names(two_reports: str) -> None:
    result = _app(two_reports, "jobs", "pause", "report", env={"REGENT_APP": BILLING_APP})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "paused report (schedule billing)"
    assert _paused(two_reports) == {"default": False, "billing": True}


def test_jobs_pause_takes_the_schedule_of_the_app_option(two_reports: str) -> None:
    result = _app(two_reports, "jobs", "pause", "report", "--app", BILLING_APP)
    assert result.returncode == 0, result.stderr
    assert _paused(two_reports) == {"default": False, "billing": True}


def test_jobs_schedule_option_names_the_schedule(two_reports: str) -> None:
    result = _app(two_reports, "jobs", "--schedule", "billing", "pause", "report")
    assert result.returncode == 0, result.stderr
    assert "(schedule billing)" in result.stdout
    assert _paused(two_reports) == {"default": False, "billing": True}


def test_a_job_unknown_in_the_apps_schedule_is_one_line_naming_it_and_exits_2(
    two_reports: str,
) -> None:
    result = _app(two_reports, "jobs", "run", "nightly", env={"REGENT_APP": BILLING_APP})
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "'nightly'" in line and "schedule 'billing'" in line


def test_the_app_option_finds_the_scheduler_of_an_app_inside_middleware(
    two_reports: str,
) -> None:
    result = _app(two_reports, "jobs", "pause", "report", "--app", f"{BILLING_APP[:-3]}wrapped")
    assert result.returncode == 0, result.stderr
    assert _paused(two_reports) == {"default": False, "billing": True}


@pytest.mark.parametrize(
    "args",
    [["jobs", "--json", "history", "nightly"], ["outbox", "--json", "stuck"]],
)
def test_json_given_before_the_sub_command_prints_json(with_runs: str, args: list[str]) -> None:
    result = _app(with_runs, *args)
    assert result.returncode == 0, result.stderr
    assert isinstance(json.loads(result.stdout), list)


def test_a_reader_that_goes_away_ends_the_command_quietly(seeded: str) -> None:
    with subprocess.Popen(
        [sys.executable, "-m", "app", "jobs"],
        env={**os.environ, "DATABASE_URL": seeded},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as command:
        # The reader closes its end before the command writes (`jobs | head -0`).
        assert command.stdout is not None and command.stderr is not None
        command.stdout.close()
        stderr = command.stderr.read()
        assert command.wait(timeout=60) == 141
    assert stderr == ""


def test_a_paused_job_reads_paused_not_its_next_run(seeded: str) -> None:
    assert _app(seeded, "jobs", "pause", "nightly").returncode == 0
    [_, header, row] = _app(seeded, "jobs").stdout.splitlines()
    next_run = row[header.index("next_run_at") : header.index("waiting")]
    assert next_run.strip() == "paused"


def test_db_url_prints_the_url_a_client_logs_in_with(seeded: str) -> None:
    result = _app(seeded, "db-url")
    assert result.returncode == 0, result.stderr
    with psycopg.connect(result.stdout.strip()) as conn:
        assert conn.execute("SELECT count(*) FROM scheduler_jobs").fetchone() == (1,)


def test_a_busy_port_is_refused_naming_the_port_and_the_option(seeded: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _app(seeded, "serve", "--port", str(port))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert f"127.0.0.1:{port}" in line and "--port" in line


def test_psql_opens_psql_on_the_database_without_the_password_in_its_arguments(
    seeded: str,
) -> None:
    result = _app(seeded, "psql", "-At", "-c", "SELECT current_setting('application_name')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "psql"


def test_jobs_lists_a_retired_job_only_with_all_and_forgets_it(with_runs: str) -> None:
    _execute(with_runs, "UPDATE scheduler_jobs SET retired_at = now() WHERE id = 'nightly'")
    assert "nightly" not in _app(with_runs, "jobs").stdout
    assert "retired" in _app(with_runs, "jobs", "--all").stdout
    forgot = _app(with_runs, "jobs", "forget", "nightly")
    assert forgot.returncode == 0, forgot.stderr
    assert forgot.stdout.strip() == "forgot nightly (schedule default) and its 2 run(s)"


def test_forgetting_a_live_job_exits_non_zero_saying_why(seeded: str) -> None:
    refused = _app(seeded, "jobs", "forget", "nightly")
    assert refused.returncode == 1
    assert "remove it from the code" in refused.stderr


@pytest.mark.parametrize(
    ("args", "answer"),
    [
        (["jobs", "run", "nightly"], {"status": "queued", "job_id": "nightly"}),
        (["jobs", "pause", "nightly"], {"status": "paused", "job_id": "nightly"}),
        (["jobs", "resume", "nightly"], {"status": "resumed", "job_id": "nightly"}),
        (["outbox", "reset", "grants", "41"], {"status": "pending", "message_id": 41}),
        (["outbox", "reset", "grants", "--all-stuck"], {"status": "pending", "reset": 1}),
    ],
)
def test_every_write_command_prints_json_for_scripts(
    seeded: str, args: list[str], answer: dict[str, object]
) -> None:
    result = _app(seeded, *args, "--json")
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed.items() >= answer.items()


def test_forgetting_a_retired_job_prints_json_for_scripts(with_runs: str) -> None:
    _execute(with_runs, "UPDATE scheduler_jobs SET retired_at = now() WHERE id = 'nightly'")
    forgot = _app(with_runs, "jobs", "forget", "nightly", "--json")
    assert forgot.returncode == 0, forgot.stderr
    assert json.loads(forgot.stdout) == {
        "status": "forgotten",
        "job_id": "nightly",
        "schedule": "default",
        "runs_deleted": 2,
    }
