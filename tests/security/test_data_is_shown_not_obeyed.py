"""What data carries is shown, never obeyed: keys, errors, job ids and names reach the
operator's terminal and the application log with their control characters escaped, one
row or one event per line."""

from __future__ import annotations

import logging
import logging.config
import os
import re
import socket
import subprocess
from pathlib import Path

import httpx
import psycopg
import pytest
import uvicorn.config

from app.db import Database, asyncpg_dsn
from app.logging import configure_logging
from app.outbox import HttpTransport, Outbox
from app.printable import printable
from tests.forked_cli import run_app

from ..conftest import admin_session
from .conftest import ADMIN_TOKEN, Open, serve_python_m_app

# Retitle the terminal, clear it, forge a line, reverse the text that follows.
HOSTILE = "k\x1b]0;owned\x07\x1b[2J\r\n2026-12-04 09:00:00 INFO all jobs ok\u202eevil"
RAW = ("\x1b", "\x07", "\r", "\u202e")


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("\x1b[2J", "\\x1b[2J"),
        ("bell\x07", "bell\\x07"),
        ("a\rb", "a\\rb"),
        ("a\nb", "a\\nb"),
        ("a\tb", "a\\tb"),
        ("\x7f\x85", "\\x7f\\x85"),
        ("abc\u202edef", "abc\\u202edef"),
        ("line\u2028sep", "line\\u2028sep"),
        ("rechnung-müller-42 €", "rechnung-müller-42 €"),
        ("C:\\path", "C:\\path"),
    ],
)
def test_printable_escapes_control_characters_and_keeps_the_rest(text: str, shown: str) -> None:
    assert printable(text) == shown


def _app(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_app(list(args), {**os.environ, "DATABASE_URL": database_url})


@pytest.fixture
def hostile_rows(database_url: str) -> str:
    """A stuck and a pending row whose key and last error are HOSTILE, and a job whose
    name is and whose run failed with it."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        for status in ("stuck", "pending"):
            conn.execute(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at, last_error) VALUES"
                " ('grants', %s, '{}', %s, 3, now(), now(), now(), %s)",
                (f"{status}-{HOSTILE}", status, HOSTILE),
            )
        conn.execute(
            "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
            " VALUES ('nightly', %s, 'every 60s', now())",
            (HOSTILE,),
        )
        conn.execute(
            "INSERT INTO scheduler_runs (job_id, scope, slot, manual, started_at,"
            " finished_at, status, lateness_ms, duration_ms, pid, host, error) VALUES"
            " ('nightly', 'leader', now(), false, now(), now(), 'error', 0, 0, 1, %s, %s)",
            (HOSTILE, f"RuntimeError: {HOSTILE}"),
        )
    return database_url


@pytest.mark.parametrize(
    "command",
    [
        ("outbox", "stuck"),
        ("outbox", "pending"),
        ("jobs",),
        ("jobs", "history", "nightly"),
    ],
    ids=" ".join,
)
def test_the_cli_shows_data_escaped_one_row_per_line(
    hostile_rows: str, command: tuple[str, ...]
) -> None:
    result = _app(hostile_rows, *command)
    assert result.returncode == 0, result.stderr
    assert not [c for c in RAW if c in result.stdout], result.stdout
    lines = result.stdout.rstrip("\n").split("\n")
    assert [line for line in lines if "\\x1b]0;owned" in line], result.stdout
    assert not [line for line in lines if line.startswith("2026-12-04")], result.stdout


@pytest.mark.parametrize("status", ["stuck", "pending"])
def test_the_cli_shows_two_keys_that_differ_after_a_line_break_as_two(
    database_url: str, status: str
) -> None:
    # A key is who a message is: shown by its first line, these two would look alike.
    with psycopg.connect(database_url, autocommit=True) as conn:
        for key in ("invoice-42\nfor alice", "invoice-42\nfor bob"):
            conn.execute(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at) VALUES"
                " ('grants', %s, '{}', %s, 3, now(), now(), now())",
                (key, status),
            )
    result = _app(database_url, "outbox", status)
    assert result.returncode == 0, result.stderr
    assert "invoice-42\\nfor alice" in result.stdout, result.stdout
    assert "invoice-42\\nfor bob" in result.stdout, result.stdout


def test_a_full_history_shows_errors_escaped(hostile_rows: str) -> None:
    result = _app(hostile_rows, "jobs", "history", "nightly", "--full")
    assert result.returncode == 0, result.stderr
    assert not [c for c in RAW if c in result.stdout], result.stdout
    # Its line breaks are kept, indented under "run 1:": no line of data starts a line.
    assert "    RuntimeError: k\\x1b]0;owned\\x07\\x1b[2J\\r\n" in result.stdout
    assert "    2026-12-04 09:00:00 INFO all jobs ok\\u202eevil" in result.stdout
    assert not [line for line in result.stdout.split("\n") if line.startswith("2026-12-04")]


@pytest.mark.parametrize(
    "command", [("outbox", "stuck", "--json"), ("jobs", "--json")], ids=" ".join
)
def test_the_cli_json_carries_data_escaped(hostile_rows: str, command: tuple[str, ...]) -> None:
    result = _app(hostile_rows, *command)
    assert result.returncode == 0, result.stderr
    assert not [c for c in RAW if c in result.stdout], result.stdout


def test_a_cli_error_naming_data_is_one_escaped_line(hostile_rows: str) -> None:
    result = _app(hostile_rows, "jobs", "run", f"x{HOSTILE}")
    assert result.returncode != 0
    assert not [c for c in RAW if c in result.stderr], result.stderr
    assert result.stderr.count("\n") == 1, result.stderr


async def test_a_receivers_error_body_stays_on_its_log_line(
    database: Database, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, text=f"bad grant\r\n{HOSTILE}")

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    outbox = Outbox("grants", HttpTransport("http://receiver.test/grants", client=client))
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database_url))
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, {"amount": 5}, key="grant-1")
    configure_logging("INFO")
    [handler] = [h for h in logging.getLogger().handlers if getattr(h, "_regent", False)]
    with caplog.at_level(logging.INFO, logger="app.outbox"):
        report = await outbox.drain_once()
    await client.aclose()
    assert report.stuck == 1
    [stuck] = [r for r in caplog.records if r.getMessage().startswith("outbox.stuck")]
    line = handler.format(stuck)
    assert "\n" not in line and not [c for c in RAW if c in line], line
    assert "bad grant\\r\\nk\\x1b]0;owned" in line


# What a client may put in X-Forwarded-For, which a proxy named in TRUSTED_PROXIES passes
# on as the client's address: C1 CSI and OSC, a string terminator, U+202E.
_FORWARDED = b"9.9.9.9\xc2\x9b2J\xc2\x9d0;TITLE\xc2\x9c\xe2\x80\xae"
_RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")


def test_uvicorns_access_line_shows_a_forwarded_address_escaped(
    database_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "output.txt"
    for port in serve_python_m_app(database_url, log, TRUSTED_PROXIES="127.0.0.1"):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(
                b"GET /healthz?seen=1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                b"X-Forwarded-For: " + _FORWARDED + b"\r\n\r\n"
            )
            assert conn.recv(64).startswith(b"HTTP/1.1 200")
    # The server has stopped: its buffered output is all in the log.
    [line] = [line for line in log.read_text().splitlines() if "seen=1" in line]
    assert _RAW.search(line) is None, line
    # uvicorn reads header bytes as latin-1: each UTF-8 byte above 0x7f is a character.
    assert "\\x9b2J" in line and "\\x9d0;TITLE" in line, line


def test_uvicorns_own_log_lines_show_data_escaped_under_its_own_log_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Plain `uvicorn app.main:app` configures its loggers before it imports the app.
    logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)
    configure_logging("INFO")
    access = ("9.9.9.9\x1b]0;TITLE\x07\u202e:1", "GET", "/x\r\nforged", "1.1", 200)
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', *access)
    try:
        raise ValueError("a body\nwith\x1b[2J lines")
    except ValueError:
        logging.getLogger("uvicorn.error").exception("Exception in ASGI application")
    written = capsys.readouterr()
    lines = (written.out + written.err).splitlines()
    assert lines and all(_RAW.search(line) is None for line in lines), lines
    assert not any(line.startswith("forged") for line in lines), lines
    assert all(line.startswith((" ", "INFO", "ERROR")) for line in lines), lines


@pytest.mark.parametrize("screen", ["/", "/jobs/nightly"])
async def test_the_admin_page_shows_data_escaped(
    hostile_rows: str, open_app: Open, screen: str
) -> None:
    # U+202E in a job's name would reverse what follows it on the operator's screen.
    async with open_app() as client:
        base = await admin_session(client, ADMIN_TOKEN)
        page = await client.get(f"{base}{screen}")
    assert page.status_code == 200, page.text
    # Line breaks are text to HTML; the rest would act, or hide, on screen.
    assert not [c for c in RAW if c in page.text and c not in "\r\n"]
    assert "\\u202eevil" in page.text and "\\x1b]0;owned" in page.text
