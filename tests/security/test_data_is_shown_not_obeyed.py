"""What data carries is shown, never obeyed: keys, errors, job ids and names reach the
operator's terminal and the application log with their control characters escaped, one
row or one event per line."""

from __future__ import annotations

import html
import html.parser
import logging
import logging.config
import os
import re
import socket
import subprocess
import unicodedata
from pathlib import Path
from urllib.parse import quote, unquote, urljoin, urlsplit

import httpx
import psycopg
import pytest
import uvicorn.config

from app.cli.output import table
from app.db import Database, asyncpg_dsn
from app.logging import configure_logging
from app.outbox import HttpTransport, Outbox
from app.printable import printable, printable_name, printable_text
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


# Invisible format characters (Unicode category Cf and the like): a zero-width space, a
# BOM (zero-width no-break space), a soft hyphen, a word joiner, a tag character (a
# hidden "A": text smuggled past the eye), a Mongolian vowel separator, and a no-break
# space, which looks like a space.
_INVISIBLE = [
    ("\u200b", "\\u200b"),
    ("\ufeff", "\\ufeff"),
    ("\u00ad", "\\xad"),
    ("\u2060", "\\u2060"),
    ("\U000e0041", "\\U000e0041"),
    ("\u180e", "\\u180e"),
    ("\u00a0", "\\xa0"),
    ("\ue000", "\\ue000"),
    # Drawn as a blank cell a letter wide.
    ("\u2800", "\\u2800"),
    ("\U0001d159", "\\U0001d159"),
]


@pytest.mark.parametrize(
    ("char", "shown"), _INVISIBLE, ids=[f"U+{ord(char):04X}" for char, _ in _INVISIBLE]
)
def test_an_invisible_format_character_is_shown_escaped(char: str, shown: str) -> None:
    # "invoice-42" and "invoice-\u200b42" are two keys; shown alike, an operator resets
    # or forgets the other one.
    assert printable(f"invoice-{char}42") == f"invoice-{shown}42"
    assert printable_text(f"invoice-{char}42\n") == f"invoice-{shown}42\n"


def test_printable_text_keeps_line_breaks_and_tabs_and_escapes_the_rest() -> None:
    assert printable_text("a\r\n\tb\x1b\u2028\u200b") == "a\r\n\tb\\x1b\\u2028\\u200b"


def _insert_keys(database_url: str, keys: tuple[str, ...], error: str = "x") -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        for key in keys:
            conn.execute(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at, last_error) VALUES"
                " ('grants', %s, '{}', 'stuck', 3, now(), now(), now(), %s)",
                (key, error),
            )


class _Cells(html.parser.HTMLParser):
    """The text of each ``<td data-label="key">`` of a page, as an HTML parser reads it
    (which turns a CR, or CR LF, into LF)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.cells: list[str] = []
        self._in: bool = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "td" and ("data-label", "key") in attrs:
            self._in = True
            self.cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "td":
            self._in = False

    def handle_data(self, data: str) -> None:
        if self._in:
            self.cells[-1] += data


def _key_cells(page: str) -> list[str]:
    parser = _Cells()
    parser.feed(page.replace("\r\n", "\n").replace("\r", "\n"))
    return parser.cells


async def test_the_admin_page_shows_an_invisible_character_in_a_key_escaped(
    open_app: Open, database_url: str
) -> None:
    _insert_keys(database_url, ("invoice-42", "invoice-\u200b42"))
    async with open_app() as client:
        base = await admin_session(client, ADMIN_TOKEN)
        page = await client.get(f"{base}/")
    assert page.status_code == 200
    assert "\u200b" not in page.text, "the zero-width space reaches the page as it is"
    assert sorted(_key_cells(page.text)) == ["invoice-42", "invoice-\\u200b42"]


async def test_keys_that_differ_by_a_line_break_or_spaces_look_different_on_the_admin_page(
    open_app: Open, database_url: str
) -> None:
    # HTML lays out a run of white space (LF, CR, TAB, spaces) as one space, and none at
    # the ends of a cell: each of these keys would look like "invoice-42 for alice".
    keys = (
        "invoice-42 for alice",
        "invoice-42\nfor alice",
        "invoice-42\rfor alice",
        "invoice-42\r\nfor alice",
        "invoice-42\tfor alice",
        "invoice-42  for alice",
        " invoice-42 for alice",
        "invoice-42 for alice ",
    )
    _insert_keys(database_url, keys)
    async with open_app() as client:
        base = await admin_session(client, ADMIN_TOKEN)
        page = await client.get(f"{base}/")
    assert page.status_code == 200
    cells = _key_cells(page.text)
    assert len(cells) == len(keys), cells
    laid_out = {" ".join(cell.split()) for cell in cells}
    assert len(laid_out) == len(keys), f"the page shows {len(keys)} keys as {laid_out}"
    assert "invoice-42\\nfor alice" in laid_out and "invoice-42\\r\\nfor alice" in laid_out


async def test_an_error_on_the_admin_page_stays_readable_as_lines(
    open_app: Open, database_url: str
) -> None:
    # A traceback is shown as its lines, its control characters (but for its line
    # breaks) and invisible characters escaped.
    error = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: a\u200bb'
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
            " VALUES ('nightly', 'nightly', 'every 60s', now())"
        )
        conn.execute(
            "INSERT INTO scheduler_runs (job_id, scope, slot, manual, started_at,"
            " finished_at, status, lateness_ms, duration_ms, pid, host, error) VALUES"
            " ('nightly', 'leader', now(), false, now(), now(), 'error', 0, 0, 1, 'h', %s)",
            (error,),
        )
    async with open_app() as client:
        base = await admin_session(client, ADMIN_TOKEN)
        page = await client.get(f"{base}/jobs/nightly")
    assert page.status_code == 200
    shown = html.unescape(page.text)
    assert '<pre>Traceback (most recent call last):\n  File "x.py", line 1\n' in shown
    assert "ValueError: a\\u200bb</pre>" in shown


_ACTIONS = (
    r"/logout",
    r"/jobs/(?P<job>[^/]+)/(run|pause|resume|forget)",
    r"/outboxes/(?P<outbox>[^/]+)/(reset-stuck|forget)",
    r"/outboxes/(?P<outbox>[^/]+)/messages/\d+/reset",
)
_LINKS = (r"/", r"/jobs/(?P<job>[^/]+)")


async def test_a_data_value_in_a_url_stays_one_path_segment(
    open_app: Open, database_url: str
) -> None:
    # An outbox column or a job id is any text in the database (rows can be written by
    # any service sharing it); built into a form's action unencoded, dot segments in it
    # would send the button's POST, with the session's CSRF value, to another action.
    hostile = ["x/../../jobs/report_warm/forget?", "..", ".", "a b#c%2F?d=e&f"]
    with psycopg.connect(database_url, autocommit=True) as conn:
        for n, name in enumerate(hostile):
            conn.execute(
                "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                " next_attempt_at, created_at, updated_at, last_error) VALUES"
                " (%s, 'k', '{}', 'stuck', 3, now(), now(), now(), 'x')",
                (name,),
            )
            conn.execute(
                "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at, retired_at)"
                " VALUES (%s, 'j', 'every 60s', now(), CASE WHEN %s THEN now() END)",
                (name, n % 2 == 0),
            )
    async with open_app() as client:
        base = await admin_session(client, ADMIN_TOKEN)
        pages = [await client.get(f"{base}/")]
        pages += [await client.get(f"{base}/jobs/{quote(name, safe='')}") for name in hostile]
    assert pages[0].status_code == 200
    seen: set[str] = set()
    for page in pages:
        for attribute, routes in (("action", _ACTIONS), ("href", _LINKS)):
            urls = re.findall(rf'{attribute}="([^"]+)"', page.text)
            for url in (html.unescape(u) for u in urls if "/admin.css" not in u):
                path = urlsplit(urljoin(f"http://test{base}/", url)).path
                match = next(
                    (m for r in routes if (m := re.fullmatch(re.escape(base) + r, path))), None
                )
                assert match is not None, (url, path)
                seen.update(unquote(s) for s in match.groupdict().values() if s is not None)
                # A browser takes "%2E" for a dot (WHATWG URL): there a value of only
                # dots resolves away, and its buttons must then reach no action.
                dotted = re.sub("%2e", ".", url, flags=re.IGNORECASE)
                browser = urlsplit(urljoin(f"http://test{base}/", dotted)).path
                if browser != path and attribute == "action":
                    for route in _ACTIONS:
                        assert not re.fullmatch(re.escape(base) + route, browser), (url, browser)
    assert set(hostile) <= seen, seen


async def test_an_encoded_job_id_in_a_button_reaches_its_job(
    open_app: Open, database_url: str
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO scheduler_jobs (id, name, trigger, next_run_at)"
            " VALUES ('report.eu:nightly', 'j', 'every 60s', now())"
        )
    async with open_app() as client:
        base = await admin_session(client, ADMIN_TOKEN)
        page = await client.get(f"{base}/")
        [action] = re.findall(r'action="([^"]+/pause)"', page.text)
        [csrf] = re.findall(r'name="csrf" value="([^"]+)"', page.text)[:1]
        paused = await client.post(html.unescape(action), data={"csrf": csrf})
    assert "%3A" in action, action
    assert paused.status_code == 303, paused.text
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT paused FROM scheduler_jobs WHERE id = 'report.eu:nightly'")
        assert row.fetchone() == (True,)


def test_keys_that_differ_by_a_space_at_either_end_look_different_in_a_cli_table() -> None:
    rows = [{"id": 1, "key": "invoice-42"}, {"id": 1, "key": "invoice-42 "}]
    for columns in (["id", "key"], ["key", "id"]):
        first, second = table(rows, columns).splitlines()[1:]
        assert first != second, columns


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("café", "cafe\u0301"),  # composed, and a letter with a combining accent
        ("\ud55c", "\u1112\u1161\u11ab"),  # a Hangul syllable, and its letters
        ("\u00c5", "\u212b"),  # A with ring, and the angstrom sign
        ("invoice-42 ", "invoice-42\\x20"),  # a space, and text that spells its escape
        ("invoice-\u200b42", "invoice-\\u200b42"),
    ],
    ids=["combining", "hangul", "angstrom", "spelled-space", "spelled-zero-width"],
)
def test_two_keys_unicode_or_an_escape_would_spell_alike_look_different(
    one: str, other: str
) -> None:
    # Text that normalizes to one form is drawn alike.
    def drawn(shown: str) -> str:
        return unicodedata.normalize("NFC", shown)

    assert drawn(printable_name(one)) != drawn(printable_name(other))
    rows = [{"key": one, "id": 1}, {"key": other, "id": 1}]
    first, second = table(rows, ["key", "id"]).splitlines()[1:]
    assert drawn(first) != drawn(second)
