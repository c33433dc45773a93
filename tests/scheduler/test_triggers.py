"""Trigger math: cron in IANA zones across DST, intervals, coalescing arithmetic."""

import functools
import itertools
import zoneinfo
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler import cron, every
from app.scheduler.triggers import COUNTED_SLOTS, Trigger

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
    *(
        pytest.param(
            f"30 {hours} * * *",
            "Europe/Zurich",
            _local("Europe/Zurich", 2026, 10, 25, 0, 45),
            ["2026-10-25T02:30:00+02:00", "2026-10-25T02:30:00+01:00", "2026-10-25T04:30:00+01:00"],
            id=f"zurich-fall-fold-hour-step-{hours}-fires-in-both-occurrences",
        )
        for hours in ("0-23/2", "0/2", "0-22/2")
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
    pytest.param(
        "0 * * * *",
        "Australia/Lord_Howe",
        _local("Australia/Lord_Howe", 2026, 10, 4, 0, 30),
        ["2026-10-04T01:00:00+10:30", "2026-10-04T02:30:00+11:00", "2026-10-04T03:00:00+11:00"],
        id="lord-howe-wildcard-hour-gap-fires-after-the-gap",
    ),
    pytest.param(
        "0 */2 * * *",
        "Australia/Lord_Howe",
        _local("Australia/Lord_Howe", 2026, 10, 4, 0, 30),
        ["2026-10-04T02:30:00+11:00", "2026-10-04T04:00:00+11:00"],
        id="lord-howe-step-hour-gap-fires-after-the-gap",
    ),
    pytest.param(
        "*/30 * * * *",
        "Australia/Lord_Howe",
        _local("Australia/Lord_Howe", 2026, 10, 4, 1, 15),
        ["2026-10-04T01:30:00+10:30", "2026-10-04T02:30:00+11:00", "2026-10-04T03:00:00+11:00"],
        id="lord-howe-gap-slot-and-the-slot-after-it-are-one",
    ),
    pytest.param(
        "0 * * * *",
        "Pacific/Chatham",
        _local("Pacific/Chatham", 2026, 9, 27, 1, 30),
        ["2026-09-27T02:00:00+12:45", "2026-09-27T03:45:00+13:45", "2026-09-27T04:00:00+13:45"],
        id="chatham-wildcard-hour-gap-fires-after-the-gap",
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


# Every zone's transitions, 2020-2027, for a few expressions with fixed, wildcard and
# step hours. The rule, checked minute by minute against an independent oracle:
# - a matching wall time that exists fires at its instant;
# - a matching wall time inside a spring-forward gap fires once, at the first valid
#   instant after the gap (the transition), which is the same slot as a matching wall
#   time at that instant;
# - a matching wall time repeated by a fall-back fires in its first occurrence only when
#   the hour is fixed, in both when the hour is a wildcard or a step.
# Zones with the same transition (wall time and offsets) behave alike: one of each
# (69 distinct transitions among all zones).
ORACLE_EXPRESSIONS: dict[str, tuple[Callable[[datetime], bool], bool, timedelta]] = {
    # expression: (matches a wall time, fixed hour, the nominal gap between fires)
    "0 * * * *": (lambda wall: wall.minute == 0, False, timedelta(hours=1)),
    "*/30 * * * *": (lambda wall: wall.minute % 30 == 0, False, timedelta(minutes=30)),
    "0 */2 * * *": (
        lambda wall: wall.minute == 0 and wall.hour % 2 == 0,
        False,
        timedelta(hours=2),
    ),
    "30 2 * * *": (lambda wall: (wall.hour, wall.minute) == (2, 30), True, timedelta(days=1)),
}


@dataclass(frozen=True)
class _Transition:
    zone: str
    at: datetime
    before: timedelta
    after: timedelta


def _offset(zone: ZoneInfo, moment: datetime) -> timedelta:
    offset = moment.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _at(timestamp: int) -> datetime:
    return datetime.fromtimestamp(timestamp, UTC)


def _transitions(name: str, start: datetime, end: datetime) -> list[_Transition]:
    """Offset changes of a zone: sampled weekly, each found to the second."""
    zone, found, week = ZoneInfo(name), [], timedelta(days=7)
    low = start
    while low < end:
        high = low + week
        if _offset(zone, low) != _offset(zone, high):
            lo, hi = int(low.timestamp()), int(high.timestamp())
            while hi - lo > 1:
                middle = (lo + hi) // 2
                same = _offset(zone, _at(middle)) == _offset(zone, _at(lo))
                lo, hi = (middle, hi) if same else (lo, middle)
            found.append(_Transition(name, _at(hi), _offset(zone, _at(lo)), _offset(zone, _at(hi))))
        low = high
    return found


@functools.cache
def _distinct_transitions() -> list[_Transition]:
    start, end = datetime(2020, 1, 1, tzinfo=UTC), datetime(2028, 1, 1, tzinfo=UTC)
    distinct: dict[tuple[object, ...], _Transition] = {}
    for name in sorted(zoneinfo.available_timezones()):
        for change in _transitions(name, start, end):
            wall = (change.at + change.before).time()
            distinct.setdefault((wall, change.before, change.after), change)
    return list(distinct.values())


def _oracle(expression: str, change: _Transition, start: datetime, end: datetime) -> list[datetime]:
    matches, fixed_hour, _ = ORACLE_EXPRESSIONS[expression]
    zone, minute = ZoneInfo(change.zone), timedelta(minutes=1)
    slots: set[datetime] = set()
    moment = start + minute
    while moment <= end:
        local = moment.astimezone(zone)
        wall = local.replace(tzinfo=None)
        repeated = wall.replace(fold=0, tzinfo=zone).utcoffset() != local.utcoffset()
        if matches(wall) and not (fixed_hour and repeated):
            slots.add(moment)
        moment += minute
    if change.after > change.before and start < change.at <= end:
        wall = (change.at + change.before).replace(tzinfo=None)
        while wall < (change.at + change.after).replace(tzinfo=None):
            if matches(wall):
                slots.add(change.at)
            wall += minute
    return sorted(slots)


@pytest.mark.parametrize("expression", list(ORACLE_EXPRESSIONS))
def test_cron_follows_one_dst_rule_at_every_zone_transition(expression: str) -> None:
    _, _, nominal = ORACLE_EXPRESSIONS[expression]
    for change in _distinct_transitions():
        shift = abs(change.after - change.before)
        reach = nominal + shift + timedelta(hours=1)
        start = (change.at - reach).replace(second=0)
        end = change.at + reach
        trigger = cron(expression, tz=change.zone)
        fired, moment = [], start
        while (moment := trigger.next_after(moment, UTC_ZONE)) <= end:
            fired.append(moment)
        where = f"{expression!r} in {change.zone} at {change.at.isoformat()}"
        assert fired == _oracle(expression, change, start, end), where
        assert all(b - a <= nominal + shift for a, b in itertools.pairwise(fired)), where


def test_cron_catch_up_finds_the_latest_slot_without_walking_the_outage() -> None:
    trigger = cron("* * * * *", tz="Europe/Zurich")
    due = datetime(2026, 1, 1, tzinfo=UTC)
    now = due + timedelta(days=365, seconds=30)
    latest, passed = trigger.latest_slot(due, now, UTC_ZONE)
    assert latest == due + timedelta(days=365)
    # Counted one by one only up to the bound: the note then says "at least".
    assert passed == COUNTED_SLOTS


ZONES = [
    "UTC",
    "Europe/Zurich",
    "America/New_York",
    "America/Santiago",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Antarctica/Casey",
    "Asia/Kathmandu",
    "Africa/Casablanca",
]
MINUTES = st.sampled_from(["*", "0", "30", "*/15", "*/7", "5,35", "10-20"])
HOURS = st.sampled_from(["*", "2", "3", "*/2", "*/5", "1-3", "0,12"])
DAYS = st.sampled_from(["*", "1", "*/3"])
WEEKDAYS = st.sampled_from(["*", "1-5", "0"])


def _walked(trigger: Trigger, due: datetime, now: datetime) -> tuple[datetime, int]:
    """The plain walk, slot after slot: the reference for the bounded catch-up."""
    latest, passed = due, 0
    while (following := trigger.next_after(latest, UTC_ZONE)) <= now:
        latest, passed = following, passed + 1
    return latest, passed


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    minute=MINUTES,
    hour=HOURS,
    day=DAYS,
    weekday=WEEKDAYS,
    zone=st.sampled_from(ZONES),
    start=st.datetimes(datetime(2020, 1, 1), datetime(2027, 12, 31), timezones=st.just(UTC)),
    on_a_slot=st.booleans(),
    outage=st.timedeltas(timedelta(0), timedelta(hours=30)),
)
def test_cron_catch_up_equals_the_slot_by_slot_walk(
    minute: str,
    hour: str,
    day: str,
    weekday: str,
    zone: str,
    start: datetime,
    on_a_slot: bool,
    outage: timedelta,
) -> None:
    trigger = cron(f"{minute} {hour} {day} * {weekday}", tz=zone)
    # ``due`` is a slot, or a first_run moment that is not one.
    due = trigger.next_after(start, UTC_ZONE) if on_a_slot else start
    now = due + outage
    latest, passed = _walked(trigger, due, now)
    assert trigger.latest_slot(due, now, UTC_ZONE) == (latest, min(passed, COUNTED_SLOTS))


@settings(max_examples=150, derandomize=True, deadline=None)
@given(
    minute=MINUTES,
    hour=HOURS,
    day=DAYS,
    weekday=WEEKDAYS,
    zone=st.sampled_from(ZONES),
    start=st.datetimes(datetime(2020, 1, 1), datetime(2027, 12, 31), timezones=st.just(UTC)),
)
def test_cron_previous_slot_is_the_slot_next_after_steps_from(
    minute: str, hour: str, day: str, weekday: str, zone: str, start: datetime
) -> None:
    trigger = cron(f"{minute} {hour} {day} * {weekday}", tz=zone)
    slot = trigger.next_after(trigger.next_after(start, UTC_ZONE), UTC_ZONE)
    previous = trigger.previous_slot(slot, UTC_ZONE)
    assert previous < slot
    assert trigger.next_after(previous, UTC_ZONE) == slot


@pytest.mark.parametrize(
    ("trigger", "slot", "previous"),
    [
        (
            every(minutes=15),
            datetime(2026, 1, 1, 12, tzinfo=UTC),
            datetime(2026, 1, 1, 11, 45, tzinfo=UTC),
        ),
        (
            cron("0 6 * * 1-5", tz="UTC"),
            datetime(2026, 1, 5, 6, tzinfo=UTC),
            datetime(2026, 1, 2, 6, tzinfo=UTC),
        ),
        # Fall-back in Zurich: a fixed hour fires in the first occurrence only.
        (
            cron("30 2 * * *", tz="Europe/Zurich"),
            datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
            datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        ),
    ],
)
def test_previous_slot(trigger: Trigger, slot: datetime, previous: datetime) -> None:
    assert trigger.previous_slot(slot, UTC_ZONE) == previous
