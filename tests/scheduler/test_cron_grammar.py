"""Every cron expression Regent accepts means one thing, and the rest is refused by name.

Each accepted class is checked against an oracle written here without croniter (a
day predicate and the day's times, read straight from the grammar in
app/scheduler/cron_grammar.py), from moments spread over 1970-2100, in UTC (the DST
rules are tests/scheduler/test_triggers.py's).
"""

from __future__ import annotations

import calendar
import random
import zlib
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.scheduler import InvalidJobError, JobContext, Scheduler, cron
from app.scheduler.cron_grammar import parse

UTC_ZONE = ZoneInfo("UTC")
MONDAY, FRIDAY, SUNDAY = 0, 4, 6  # date.weekday()


def _nth_weekday(day: date) -> int:
    return (day.day - 1) // 7 + 1


def _is_last_weekday(day: date) -> bool:
    return day.day + 7 > calendar.monthrange(day.year, day.month)[1]


def _is_last_day(day: date) -> bool:
    return day.day == calendar.monthrange(day.year, day.month)[1]


def _at(*times: tuple[int, int]) -> list[time]:
    return [time(hour, minute) for hour, minute in times]


def _every(minutes: range, hours: range = range(24)) -> list[time]:
    return [time(hour, minute) for hour in hours for minute in minutes]


# expression -> (is the day due, the day's due times): the grammar's meaning, by hand.
ORACLE: dict[str, tuple[Callable[[date], bool], list[time]]] = {
    "0 6 * * *": (lambda d: True, _at((6, 0))),
    "*/15 * * * *": (lambda d: True, _every(range(0, 60, 15))),
    "5/20 8-17 * * *": (lambda d: True, _every(range(5, 60, 20), range(8, 18))),
    "0,30 9,18 * * *": (lambda d: True, _at((9, 0), (9, 30), (18, 0), (18, 30))),
    # A range of one value is that value (croniter 7 reads 3-3 as *).
    "30 3-3 * * *": (lambda d: True, _at((3, 30))),
    "3-3 0 * * *": (lambda d: True, _at((0, 3))),
    "0 0 15-15 * *": (lambda d: d.day == 15, _at((0, 0))),
    "0 0 1 dec-dec *": (lambda d: d.day == 1 and d.month == 12, _at((0, 0))),
    "0 0 1 12-dec *": (lambda d: d.day == 1 and d.month == 12, _at((0, 0))),
    "0 0 1 */3 *": (lambda d: d.day == 1 and d.month in (1, 4, 7, 10), _at((0, 0))),
    "0 12 * jan-mar mon-fri": (lambda d: d.month <= 3 and d.weekday() < 5, _at((12, 0))),
    "0 7 * * mon-sun": (lambda d: True, _at((7, 0))),
    "0 7 * * 1-5/2": (lambda d: d.weekday() in (0, 2, 4), _at((7, 0))),
    # 7 is Sunday as 0 is, and a step runs to the field's end, 7: Sunday included.
    "0 0 * * 7-7": (lambda d: d.weekday() == SUNDAY, _at((0, 0))),
    "0 0 * * sun-sun": (lambda d: d.weekday() == SUNDAY, _at((0, 0))),
    "0 0 * * 7/3": (lambda d: d.weekday() == SUNDAY, _at((0, 0))),
    "0 0 * * 1/2": (lambda d: d.weekday() in (MONDAY, 2, FRIDAY, SUNDAY), _at((0, 0))),
    "0 0 * * mon/2": (lambda d: d.weekday() in (MONDAY, 2, FRIDAY, SUNDAY), _at((0, 0))),
    "0 0 * * 2/5": (lambda d: d.weekday() in (1, SUNDAY), _at((0, 0))),
    "@monthly": (lambda d: d.day == 1, _at((0, 0))),
    "@weekly": (lambda d: d.weekday() == SUNDAY, _at((0, 0))),
    "0 0 29 2 *": (lambda d: d.month == 2 and d.day == 29, _at((0, 0))),
    "0 0 L * *": (_is_last_day, _at((0, 0))),
    "0 0 * * 5L": (lambda d: d.weekday() == FRIDAY and _is_last_weekday(d), _at((0, 0))),
    "0 0 * * 0#5": (lambda d: d.weekday() == SUNDAY and _nth_weekday(d) == 5, _at((0, 0))),
    "0 9 * * mon#1": (lambda d: d.weekday() == MONDAY and _nth_weekday(d) == 1, _at((9, 0))),
    # Both day fields restrict: either one makes the day due.
    "0 9 10 * 1": (lambda d: d.day == 10 or d.weekday() == MONDAY, _at((9, 0))),
    "0 9 10 * 1#2": (
        lambda d: d.day == 10 or (d.weekday() == MONDAY and _nth_weekday(d) == 2),
        _at((9, 0)),
    ),
    "0 0 1 * 5L": (
        lambda d: d.day == 1 or (d.weekday() == FRIDAY and _is_last_weekday(d)),
        _at((0, 0)),
    ),
    "0 9 */2 * 1": (lambda d: d.day % 2 == 1 or d.weekday() == MONDAY, _at((9, 0))),
    "0 0 L * 0": (lambda d: _is_last_day(d) or d.weekday() == SUNDAY, _at((0, 0))),
    # February 30th never comes: its Mondays alone remain.
    "0 0 30 2 1": (lambda d: d.month == 2 and d.weekday() == MONDAY, _at((0, 0))),
}


def _oracle_next(expression: str, moment: datetime) -> datetime:
    day_is_due, times = ORACLE[expression]
    day = moment.date()
    while True:
        if day_is_due(day):
            for at in times:
                candidate = datetime.combine(day, at, UTC)
                if candidate > moment:
                    return candidate
        day += timedelta(days=1)


def _moments(count: int, seed: int) -> list[datetime]:
    chance = random.Random(seed)
    start = datetime(1970, 1, 1, tzinfo=UTC)
    span = int((datetime(2100, 1, 1, tzinfo=UTC) - start).total_seconds())
    return [start + timedelta(seconds=chance.randrange(span)) for _ in range(count)]


@pytest.mark.parametrize("expression", list(ORACLE))
def test_an_accepted_cron_expression_fires_where_its_oracle_says(expression: str) -> None:
    trigger = cron(expression)
    trigger.validate()
    for moment in _moments(60, seed=zlib.crc32(expression.encode())):
        slot = moment
        # Three slots from each moment: a run of slots, not only the first.
        for _ in range(3):
            expected = _oracle_next(expression, slot)
            slot = trigger.next_after(slot, UTC_ZONE)
            assert slot == expected, f"{expression} after {moment}"


@pytest.mark.parametrize("expression", list(ORACLE))
def test_an_accepted_cron_expression_reads_the_same_backwards(expression: str) -> None:
    trigger = cron(expression)
    for moment in _moments(20, seed=7):
        slot = trigger.next_after(moment, UTC_ZONE)
        following = trigger.next_after(slot, UTC_ZONE)
        assert trigger.previous_slot(following, UTC_ZONE) == slot


async def _noop(ctx: JobContext) -> None:
    return None


@pytest.mark.parametrize(
    ("expression", "named"),
    [
        ("R * * * *", r"minute field 'R' uses R, a random value"),
        ("0 R * * *", r"hour field 'R' uses R"),
        ("H * * * *", r"minute field 'H' uses H"),
        ("0 0 15W * 1", r"day-of-month field '15W' uses W"),
        ("0 0 LW * *", r"day-of-month field 'LW' uses W"),
        ("0 0 ? * 1", r"day-of-month field '\?' uses \?"),
        ("61 * * * *", r"minute field '61' has 61, outside 0-59"),
        ("0 24 * * *", r"hour field '24' has 24, outside 0-23"),
        ("0 0 0 * *", r"day-of-month field '0' has 0, outside 1-31"),
        ("0 0 * 13 *", r"month field '13' has 13, outside 1-12"),
        ("0 0 * * 8", r"day-of-week field '8' has 8, outside 0-7"),
        ("0 0 * * funday", r"day-of-week field 'funday' has 'funday', which is not a number"),
        # The message quotes what was written, in its case.
        ("0 0 L-3 * *", r"day-of-month field 'L-3' has 'L', which is not a number"),
        ("0 0 * JANX *", r"month field 'JANX' has 'JANX', which is not a number or a name"),
        ("0 0 * * 1#6", r"day-of-week field '1#6' asks for an occurrence outside 1-5"),
        ("0 0 * * fri-mon", r"day-of-week field 'fri-mon' has the range fri-mon running backwards"),
        ("*/0 * * * *", r"minute field '\*/0' has step 0, outside 1-60"),
        ("0 0 5L * *", r"day-of-month field '5L'"),
        ("0 0 6 * * *", r"has 6 fields; it needs five fields"),
        ("0 0 31 2 *", r"is never due"),
    ],
)
def test_a_cron_expression_outside_the_grammar_is_refused_at_registration_naming_the_field(
    expression: str, named: str
) -> None:
    with pytest.raises(InvalidJobError, match=rf'job "nightly": cron expression .*{named}'):
        Scheduler().job(cron(expression), id="nightly")(_noop)


def test_a_cron_slot_is_the_same_at_every_evaluation() -> None:
    trigger = cron("0 9 10 * 1#2")
    moment = datetime(2026, 1, 1, tzinfo=UTC)
    assert len({trigger.next_after(moment, UTC_ZONE) for _ in range(20)}) == 1


@pytest.mark.parametrize(
    "expression",
    [
        "0 23/2 * * *",
        "59/2 * * * *",
        "0 0 31/2 * *",
        "0 0 1 12/5 *",
        "5/15 * * * *",
        "30 3-3 * * *",
        "0 8-17 * * *",
        "0 0 1 dec-dec *",
    ],
)
def test_croniter_is_given_no_item_whose_reading_changed_between_its_versions(
    expression: str,
) -> None:
    # croniter 6.0 (which pyproject allows) reads 23/2 as */2, croniter 7.0 reads
    # 23-23/2 and 3-3 so: a range or an ``a/n`` item handed over would make a job's
    # slots depend on the croniter each host installed.
    for handed_over in parse(expression):
        for item in ",".join(handed_over.split()).split(","):
            assert item == "*" or item.startswith("*/") or item.isdigit(), (expression, item)
