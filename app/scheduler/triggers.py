"""When a job is due: ``every(...)`` and ``cron(...)``.

Trigger math is pure: ``next_after(moment, zone)`` returns the first slot strictly
after ``moment`` as an aware UTC datetime. Due times always come from the schedule
(the previous slot), never from "last run + interval", so nothing drifts.

DST, for cron: the expression matches wall times in the job's IANA zone; each matching
wall time fires at the instant(s) below, compared in UTC. One rule for fixed, wildcard
and step hours alike:
- A wall time that exists once fires at that instant.
- A wall time inside a spring-forward gap fires at the first valid instant after the
  gap (the transition). Several gap wall times, and a matching wall time at that
  instant, are all that one slot: it fires once. So ``0 * * * *`` in
  Australia/Lord_Howe fires 01:00, 02:30, 03:00 on the night the clock jumps from 02:00
  to 02:30, ``0 */2 * * *`` fires 02:30, and ``30 2 * * *`` in Europe/Zurich fires 03:00.
- A wall time repeated by a fall-back fires once, in its first occurrence, when the
  hour field is fixed. An hour field that is a wildcard or a step (``*/30 * * * *``)
  measures elapsed time and fires in both occurrences: the classic cron rule.
No slot is lost and none fires twice; two fires are never further apart than the
expression's own gap plus the DST shift. ``next_after`` and ``latest_slot`` apply the
rule from either direction, so a catch-up never walks an outage slot by slot.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from . import cron_grammar
from .durations import finite_number
from .errors import TriggerArgumentError

__all__ = ["COUNTED_SLOTS", "Cron", "Interval", "Trigger", "cron", "every", "zone_named"]

# A catch-up counts the slots an outage passed over one by one up to this many, then
# reports "at least" this many: the count is a note, and must never stall the loop.
COUNTED_SLOTS = 100
# Fall-backs are looked for this far from a moment: longer than any since 1900.
_LOOKAHEAD = timedelta(days=1)
_ONE_SECOND = timedelta(seconds=1)
_ONE_MINUTE = timedelta(minutes=1)

# A cron expression must produce a slot from here on; croniter gives up after years.
_VALIDATION_MOMENT = datetime(2000, 1, 1, tzinfo=UTC)
_UNIT_SECONDS = {"seconds": 1, "minutes": 60, "hours": 3600, "days": 86400}
_MAX_PERIOD_SECONDS = 10 * 366 * 86400
# Names the zone database holds that are not a place: ``localtime`` is the host's own
# zone (two hosts, or one host before and after a change, would give a job different
# slots), ``posixrules`` and ``Factory`` are the database's internals, and ``right/``
# zones count leap seconds, so their wall clock is some 27 s off every other's.
_NOT_PLACES = frozenset({"localtime", "posixrules", "Factory"})
_LEAP_SECOND_ZONES = "right/"


def zone_named(name: str) -> ZoneInfo:
    """The IANA zone ``name`` names, the same on every host. Raises ValueError naming it
    for a name the zone database does not know, and for one whose meaning is the host's
    or no place's (``localtime``, ``posixrules``, ``Factory``, ``right/...``)."""
    if name in _NOT_PLACES or name.startswith(_LEAP_SECOND_ZONES):
        raise ValueError(
            f"time zone {name!r} is not a place whose clock every host shares;"
            " use an IANA name such as 'Europe/Zurich' or 'UTC'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown time zone {name!r}; use an IANA name such as 'Europe/Zurich'"
        ) from None


class Trigger(ABC):
    """A schedule: the sequence of slots at which a job is due."""

    @abstractmethod
    def validate(self) -> None:
        """Raise ValueError saying what is wrong when the trigger cannot produce slots."""

    @abstractmethod
    def next_after(self, moment: datetime, zone: ZoneInfo) -> datetime:
        """The first slot strictly after ``moment``, aware, in UTC.

        ``zone`` is the scheduler's default zone, for triggers that do not name one.
        """

    @abstractmethod
    def describe(self) -> str:
        """A stable text form, stored with the job: a change resets its countdown."""

    @abstractmethod
    def previous_slot(self, slot: datetime, zone: ZoneInfo) -> datetime:
        """The last slot strictly before ``slot`` (itself a slot), aware, in UTC."""

    def first_slot(self, now: datetime, zone: ZoneInfo) -> datetime:
        """The slot a newly registered job is first due at."""
        return self.next_after(now, zone)

    @abstractmethod
    def latest_slot(self, due: datetime, now: datetime, zone: ZoneInfo) -> tuple[datetime, int]:
        """The last slot at or before ``now`` (``due`` itself when none follows it by
        then), and how many slots after ``due`` were passed over to reach it (missed
        during an outage). The count is exact below COUNTED_SLOTS; at or above it, it
        means at least that many. Cheap whatever the outage: never a walk of it.
        """


@dataclass(frozen=True)
class Interval(Trigger):
    """Every ``period`` of elapsed time, whatever the zone."""

    period: timedelta

    def validate(self) -> None:
        """The period must be above zero."""
        if self.period <= timedelta(0):
            raise ValueError(
                f"interval must be above zero, got {self.period.total_seconds():g} s; "
                "pass seconds=, minutes=, hours= or days= to every()"
            )

    def next_after(self, moment: datetime, zone: ZoneInfo) -> datetime:
        """``moment`` + period: slots follow each other, anchored at the first one."""
        return moment.astimezone(UTC) + self.period

    def previous_slot(self, slot: datetime, zone: ZoneInfo) -> datetime:
        """``slot`` - period."""
        return slot.astimezone(UTC) - self.period

    def latest_slot(self, due: datetime, now: datetime, zone: ZoneInfo) -> tuple[datetime, int]:
        """Arithmetic, so that a long outage of a one-second job costs nothing."""
        if now < due:
            return due, 0
        passed = int((now - due) / self.period)
        return due + passed * self.period, passed

    def describe(self) -> str:
        """``every 900s``."""
        return f"every {self.period.total_seconds():g}s"


@dataclass(frozen=True)
class Cron(Trigger):
    """A five-field cron expression evaluated in an IANA zone."""

    expression: str
    tz: str | None = None

    def validate(self) -> None:
        """An expression of the grammar in cron_grammar.py, a known zone, and a slot
        to come (ValueError naming the field, the zone or the days otherwise)."""
        self._walls_expressions  # noqa: B018 (parsing is validating)
        if self.tz is not None:
            zone_named(self.tz)

    @cached_property
    def _walls_expressions(self) -> tuple[str, ...]:
        """croniter expressions whose union is this schedule, each with a slot to come
        (see cron_grammar.parse: two when both day fields restrict, and one of the two
        may match no date, e.g. '0 0 30 2 1' is the Mondays of February)."""
        due = tuple(
            expression
            for expression in cron_grammar.parse(self.expression)
            if _has_a_slot(expression)
        )
        if not due:
            raise ValueError(
                f"cron expression {self.expression!r} is never due (no date matches its "
                "day-of-month and month, e.g. February 30th); fix the day or the month"
            )
        return due

    @cached_property
    def _hour_is_elapsed_time(self) -> bool:
        return cron_grammar.hour_is_elapsed_time(self.expression)

    def next_after(self, moment: datetime, zone: ZoneInfo) -> datetime:
        """The next matching wall time in the zone, with the DST rules above."""
        local_zone = self._zone(zone)
        moment = moment.astimezone(UTC)
        # A wall time below the moment's can still fall after it, in the second pass of a
        # fall-back ahead: start from the smallest offset ahead.
        offsets = _offsets_around(moment, local_zone, _LOOKAHEAD)
        start = _wall(moment, local_zone) - (_offset(moment, local_zone) - min(offsets))
        walls = _matching_walls(self._walls_expressions, start - _ONE_SECOND, forward=True)
        best: datetime | None = None
        while True:
            wall = next(walls)
            for instant in self._instants(wall, local_zone):
                if instant > moment and (best is None or instant < best):
                    best = instant
                    offsets.append(_offset(instant, local_zone))
            # The next wall time is a minute later at least: can it still fall earlier?
            if best is not None and (wall + _ONE_MINUTE - max(offsets)).replace(tzinfo=UTC) > best:
                return best

    def previous_slot(self, slot: datetime, zone: ZoneInfo) -> datetime:
        """The matching instant before ``slot``, by the DST rules above."""
        return self._at_or_before(slot - timedelta(microseconds=1), self._zone(zone))

    def latest_slot(self, due: datetime, now: datetime, zone: ZoneInfo) -> tuple[datetime, int]:
        """Found from ``now`` backwards, never by walking the outage: the slots passed
        over are counted up to COUNTED_SLOTS, a count that reaches it meaning at least."""
        if now < due:
            return due, 0
        latest = max(due, self._at_or_before(now, self._zone(zone)))
        passed, slot = 0, due
        while slot < latest and passed < COUNTED_SLOTS:
            slot = self.next_after(slot, zone)
            passed += 1
        return latest, passed

    def describe(self) -> str:
        """``cron '0 6 * * *' Europe/Zurich``; no zone means the scheduler's default."""
        return f"cron {self.expression!r} {self.tz or 'default-zone'}"

    def _zone(self, default: ZoneInfo) -> ZoneInfo:
        return ZoneInfo(self.tz) if self.tz is not None else default

    def _at_or_before(self, moment: datetime, local_zone: ZoneInfo) -> datetime:
        """The last slot at or before ``moment``: ``next_after`` read backwards."""
        moment = moment.astimezone(UTC)
        # A wall time above the moment's can still fall before it, in the first pass of
        # a fall-back behind: start from the largest offset behind.
        offsets = _offsets_around(moment, local_zone, -_LOOKAHEAD)
        start = _wall(moment, local_zone) + (max(offsets) - _offset(moment, local_zone))
        walls = _matching_walls(self._walls_expressions, start + _ONE_SECOND, forward=False)
        best: datetime | None = None
        while True:
            wall = next(walls)
            for instant in self._instants(wall, local_zone):
                if instant <= moment and (best is None or instant > best):
                    best = instant
                    offsets.append(_offset(instant, local_zone))
            if best is not None and (wall - _ONE_MINUTE - min(offsets)).replace(tzinfo=UTC) < best:
                return best

    def _instants(self, wall: datetime, zone: ZoneInfo) -> list[datetime]:
        """The instants (UTC) at which a matching wall time fires, by the rules above."""
        first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
        if first == second:
            return [first]
        if _wall(first, zone) != wall:
            return [_gap_end(min(first, second), max(first, second), zone)]
        return [first, second] if self._hour_is_elapsed_time else [first]


def _has_a_slot(expression: str) -> bool:
    try:
        croniter(expression, _VALIDATION_MOMENT).get_next(datetime)
    except CroniterError:
        return False
    return True


def _matching_walls(
    expressions: tuple[str, ...], start: datetime, *, forward: bool
) -> Iterator[datetime]:
    """The wall times any of ``expressions`` matches, from ``start`` on (or back), in
    order, each once."""

    def walls_of(expression: str) -> Iterator[datetime]:
        walls = croniter(expression, start)
        while True:
            yield walls.get_next(datetime) if forward else walls.get_prev(datetime)

    previous = None
    for wall in heapq.merge(*map(walls_of, expressions), reverse=not forward):
        if wall != previous:
            yield wall
        previous = wall


def _offset(moment: datetime, zone: ZoneInfo) -> timedelta:
    offset = moment.astimezone(zone).utcoffset()
    assert offset is not None
    return offset


def _wall(moment: datetime, zone: ZoneInfo) -> datetime:
    return moment.astimezone(zone).replace(tzinfo=None)


def _offsets_around(moment: datetime, zone: ZoneInfo, reach: timedelta) -> list[timedelta]:
    """The offsets in force at ``moment`` and at a few points up to ``reach`` from it."""
    return [_offset(moment + reach * part, zone) for part in (0, 0.125, 1)]


def _gap_end(before: datetime, after: datetime, zone: ZoneInfo) -> datetime:
    """The first instant in (before, after] with the offset in force at ``after``: the
    first valid instant after a spring-forward gap, to the second."""
    target = _offset(after, zone)
    low, high = int(before.timestamp()), int(after.timestamp())
    while high - low > 1:
        middle = (low + high) // 2
        if _offset(datetime.fromtimestamp(middle, UTC), zone) == target:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def every(*, seconds: float = 0, minutes: float = 0, hours: float = 0, days: float = 0) -> Interval:
    """A trigger due every so much elapsed time; the first slot is one period after the
    job's row is created (or ``first_run`` after it). Validated when the job registers;
    raises TriggerArgumentError (a ValueError) at once, naming the part, for one that is
    not a finite number (int or float) at or above zero, and for parts that add up to
    more than ten years.
    """
    parts = {"seconds": seconds, "minutes": minutes, "hours": hours, "days": days}
    total = 0.0
    for unit, value in parts.items():
        number = finite_number(value)
        if number is None or not 0 <= number * _UNIT_SECONDS[unit] <= _MAX_PERIOD_SECONDS:
            raise TriggerArgumentError(
                unit,
                value,
                f"every({unit}=...) takes a finite number (int or float), not negative, and a"
                " period of at most ten years, e.g. every(seconds=5)",
            )
        total += number * _UNIT_SECONDS[unit]
    if total > _MAX_PERIOD_SECONDS:
        # Each part alone was within the bound; their sum is the period.
        given = ", ".join(f"{unit}={value!r}" for unit, value in parts.items() if value)
        raise TriggerArgumentError(
            "period",
            f"every({given})",
            f"{total / 86400:,.0f} days is past ten years; every() takes a period of at most"
            " ten years",
        )
    return Interval(timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days))


def cron(expression: str, tz: str | None = None) -> Cron:
    """A trigger due at the wall times a five-field cron expression matches in ``tz``
    (default: the TIMEZONE setting); the grammar, and what combined day fields mean,
    are in cron_grammar.py. Validated when the job registers; raises
    TriggerArgumentError at once for an expression or a zone that is not a str."""
    if not isinstance(expression, str):
        raise TriggerArgumentError(
            "expression", expression, "cron() takes the expression as a str, e.g. cron('0 6 * * *')"
        )
    if tz is not None and not isinstance(tz, str):
        raise TriggerArgumentError(
            "tz", tz, "tz is an IANA zone name as a str, e.g. tz='Europe/Zurich', or None"
        )
    return Cron(expression, tz)
