"""How the page, the CLI and the API's descriptions read values to an operator."""

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.operations import display


def test_a_timestamp_reads_in_utc_to_the_second() -> None:
    zurich_summer = timezone(timedelta(hours=2))
    moment = datetime(2026, 12, 2, 17, 47, 37, 123456, tzinfo=zurich_summer)
    assert display.timestamp(moment) == "2026-12-02 15:47:37Z"


def test_no_timestamp_reads_blank() -> None:
    assert display.timestamp(None) == ""


@pytest.mark.parametrize(
    ("milliseconds", "expected"), [(0, "0 ms"), (7, "7 ms"), (1500, "1500 ms"), (None, "")]
)
def test_a_duration_reads_in_ms_even_when_zero(milliseconds: int | None, expected: str) -> None:
    assert display.milliseconds(milliseconds) == expected


@pytest.mark.parametrize(("flag", "expected"), [(True, "yes"), (False, "no"), (None, "no")])
def test_booleans_read_yes_or_no(flag: bool | None, expected: str) -> None:
    assert display.yes_no(flag) == expected


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ("every 900s", "every 15 min"),
        ("every 3600s", "every 1 h"),
        ("every 21600s", "every 6 h"),
        ("every 86400s", "every 1 d"),
        ("every 90s", "every 90 s"),
        ("every 0.5s", "every 0.5 s"),
        ("cron '0 6 * * *' Europe/Zurich", "cron 0 6 * * * (Europe/Zurich)"),
        ("cron '0 6 * * 1-5' default-zone", "cron 0 6 * * 1-5 (America/New_York)"),
        ("something else", "something else"),
    ],
)
def test_a_trigger_reads_for_humans_naming_its_zone(stored: str, expected: str) -> None:
    assert display.trigger(stored, "America/New_York") == expected


@pytest.mark.parametrize(
    ("offset", "expected"),
    [
        (timedelta(seconds=0), "now"),
        (timedelta(seconds=40), "in 40 s"),
        (timedelta(minutes=-14, seconds=-5), "14 min ago"),
        (timedelta(hours=5, minutes=10), "in 5 h"),
        (timedelta(days=-3), "3 d ago"),
    ],
)
def test_a_moment_reads_relative_to_now(offset: timedelta, expected: str) -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert display.relative(now + offset, now) == expected


@settings(max_examples=200, derandomize=True)
@given(st.text())
def test_the_summary_of_any_error_is_one_line_of_it(error: str) -> None:
    line = display.error_summary(error)
    assert "\n" not in line and "\r" not in line
    assert line.strip() == line and line in error


def _traceback_of(exc: BaseException) -> str:
    import traceback

    return "".join(traceback.format_exception(exc))


def test_the_summary_of_a_stored_traceback_is_its_exception_line() -> None:
    try:
        try:
            raise KeyError("token")
        except KeyError as first:
            raise RuntimeError("gateway said no\nsecond line of the message") from first
    except RuntimeError as exc:
        stored = _traceback_of(exc)
    assert display.error_summary(stored) == "RuntimeError: gateway said no"


def test_the_summary_of_a_plain_note_is_its_first_line() -> None:
    assert display.error_summary("HTTP 400\nbody: nope") == "HTTP 400"


def test_no_error_summarises_blank() -> None:
    assert display.error_summary(None) == ""
