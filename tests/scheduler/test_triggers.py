"""Trigger math: cron in IANA zones across DST, intervals, coalescing arithmetic."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.scheduler import cron, every

UTC_ZONE = ZoneInfo("UTC")


def _local(zone: str, year: int, month: int, day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(zone))


def _slots(expression: str, zone: str, after: datetime, count: int) -> list[str]:
    trigger = cron(expression, tz=zone)
    trigger.validate()
    slots, moment = [], after
    for _ in range(count):
        moment = trigger.next_after(moment, UTC_ZONE)
        slots.append(moment.astimezone(ZoneInfo(zone)).isoformat())
    return slots


# (expression, zone, start, expected local slots)
DST_TABLE = [
    pytest.param(
        "30 2 * * *",
        "Europe/Zurich",
        _local("Europe/Zurich", 2026, 3, 28, 12),
        ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
        id="zurich-spring-gap-fires-once-after-the-gap",
    ),
    pytest.param(
        "30 2 * * *",
        "Europe/Zurich",
        _local("Europe/Zurich", 2026, 10, 24, 12),
        ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
        id="zurich-fall-fold-fires-once-in-the-first-occurrence",
    ),
    pytest.param(
        "*/30 * * * *",
        "Europe/Zurich",
        _local("Europe/Zurich", 2026, 10, 25, 1, 45),
        [
            "2026-10-25T02:00:00+02:00",
            "2026-10-25T02:30:00+02:00",
            "2026-10-25T02:00:00+01:00",
            "2026-10-25T02:30:00+01:00",
            "2026-10-25T03:00:00+01:00",
        ],
        id="zurich-fall-fold-step-hour-fires-in-both-occurrences",
    ),
    pytest.param(
        "0 6 * * *",
        "Europe/Zurich",
        _local("Europe/Zurich", 2026, 3, 28, 12),
        ["2026-03-29T06:00:00+02:00", "2026-03-30T06:00:00+02:00"],
        id="zurich-daily-job-keeps-wall-time-across-spring",
    ),
    pytest.param(
        "30 2 * * *",
        "America/New_York",
        _local("America/New_York", 2026, 3, 7, 12),
        ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
        id="new-york-spring-gap",
    ),
    pytest.param(
        "30 1 * * *",
        "America/New_York",
        _local("America/New_York", 2026, 10, 31, 12),
        ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
        id="new-york-fall-fold",
    ),
    pytest.param(
        "0 2 * * *",
        "Australia/Lord_Howe",
        _local("Australia/Lord_Howe", 2026, 10, 3, 12),
        ["2026-10-04T02:30:00+11:00", "2026-10-05T02:00:00+11:00"],
        id="lord-howe-half-hour-spring-gap",
    ),
    pytest.param(
        "45 1 * * *",
        "Australia/Lord_Howe",
        _local("Australia/Lord_Howe", 2026, 4, 4, 12),
        ["2026-04-05T01:45:00+11:00", "2026-04-06T01:45:00+10:30"],
        id="lord-howe-half-hour-fall-fold",
    ),
]


@pytest.mark.parametrize(("expression", "zone", "start", "expected"), DST_TABLE)
def test_cron_slots_across_dst(
    expression: str, zone: str, start: datetime, expected: list[str]
) -> None:
    assert _slots(expression, zone, start, len(expected)) == expected


def test_cron_slots_are_utc() -> None:
    slot = cron("0 6 * * *", tz="Europe/Zurich").next_after(
        datetime(2026, 1, 1, tzinfo=UTC), UTC_ZONE
    )
    assert slot == datetime(2026, 1, 1, 5, tzinfo=UTC)
    assert slot.tzinfo == UTC


def test_cron_without_zone_uses_the_default_zone() -> None:
    slot = cron("0 6 * * *").next_after(datetime(2026, 7, 1, tzinfo=UTC), ZoneInfo("Europe/Zurich"))
    assert slot == datetime(2026, 7, 1, 4, tzinfo=UTC)


def test_interval_slots_follow_the_previous_slot_not_the_run() -> None:
    trigger = every(minutes=15)
    slot = datetime(2026, 1, 1, 0, 0, tzinfo=UTC)
    assert trigger.next_after(slot, UTC_ZONE) == slot + timedelta(minutes=15)


def test_interval_latest_slot_coalesces_an_outage_arithmetically() -> None:
    trigger = every(seconds=1)
    due = datetime(2026, 1, 1, tzinfo=UTC)
    latest, passed = trigger.latest_slot(due, due + timedelta(days=3, milliseconds=500), UTC_ZONE)
    assert latest == due + timedelta(days=3)
    assert passed == 3 * 86400


def test_cron_latest_slot_counts_the_slots_passed_over() -> None:
    trigger = cron("0 * * * *", tz="UTC")
    due = datetime(2026, 1, 1, 0, tzinfo=UTC)
    latest, passed = trigger.latest_slot(due, datetime(2026, 1, 1, 5, 10, tzinfo=UTC), UTC_ZONE)
    assert (latest, passed) == (datetime(2026, 1, 1, 5, tzinfo=UTC), 5)


def test_description_changes_when_the_schedule_changes() -> None:
    assert every(minutes=15).describe() != every(minutes=5).describe()
    assert (
        cron("0 6 * * *", tz="UTC").describe() != cron("0 6 * * *", tz="Europe/Zurich").describe()
    )
