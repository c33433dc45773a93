"""When a job is due: ``every(...)`` and ``cron(...)``.

Trigger math is pure: ``next_after(moment, zone)`` returns the first slot strictly
after ``moment`` as an aware UTC datetime. Due times always come from the schedule
(the previous slot), never from "last run + interval", so nothing drifts.

DST, for cron: slots are computed in the job's IANA zone and compared in UTC.
- A wall time inside a spring-forward gap fires once, at the first valid instant
  after the gap (croniter does this).
- A wall time repeated by a fall-back fires once, in its first occurrence, when the
  hour field is fixed. An hour field that is a wildcard or a step (``*/30 * * * *``)
  measures elapsed time and fires in both occurrences: the classic cron rule.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

__all__ = ["Cron", "Interval", "Trigger", "cron", "every"]


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

    def first_slot(self, now: datetime, zone: ZoneInfo) -> datetime:
        """The slot a newly registered job is first due at."""
        return self.next_after(now, zone)

    def latest_slot(self, due: datetime, now: datetime, zone: ZoneInfo) -> tuple[datetime, int]:
        """The last slot at or before ``now``, starting from slot ``due``, and how many
        slots were passed over before it (missed during an outage)."""
        latest, passed = due, 0
        while (following := self.next_after(latest, zone)) <= now:
            latest, passed = following, passed + 1
        return latest, passed


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
        """Five valid fields and a known zone."""
        fields = self.expression.split()
        if len(fields) != 5 or not croniter.is_valid(self.expression):
            raise ValueError(
                f"cron expression {self.expression!r} is invalid; it needs five fields: "
                "minute hour day-of-month month day-of-week, e.g. '0 6 * * *'"
            )
        if self.tz is not None:
            try:
                ZoneInfo(self.tz)
            except (ZoneInfoNotFoundError, ValueError):
                raise ValueError(
                    f"unknown time zone {self.tz!r}; use an IANA name such as 'Europe/Zurich'"
                ) from None

    @property
    def _hour_is_elapsed_time(self) -> bool:
        hour = self.expression.split()[1]
        return "*" in hour or "/" in hour

    def next_after(self, moment: datetime, zone: ZoneInfo) -> datetime:
        """The next matching wall time in the zone, with the DST rules above."""
        local_zone = ZoneInfo(self.tz) if self.tz is not None else zone
        iterator = croniter(self.expression, moment.astimezone(local_zone))
        while True:
            candidate: datetime = iterator.get_next(datetime)
            if self._hour_is_elapsed_time or not _second_occurrence(candidate, local_zone):
                result = candidate.astimezone(UTC)
                if result > moment:
                    return result

    def describe(self) -> str:
        """``cron '0 6 * * *' Europe/Zurich``; no zone means the scheduler's default."""
        return f"cron {self.expression!r} {self.tz or 'default-zone'}"


def _second_occurrence(moment: datetime, zone: ZoneInfo) -> bool:
    """True when ``moment`` is the repeat of a wall time that a fall-back shows twice."""
    wall = moment.astimezone(zone).replace(tzinfo=None)
    first = wall.replace(fold=0, tzinfo=zone)
    second = wall.replace(fold=1, tzinfo=zone)
    if first.utcoffset() == second.utcoffset():
        return False
    return moment.utcoffset() == second.utcoffset() and moment.astimezone(UTC) != first.astimezone(
        UTC
    )


def every(*, seconds: float = 0, minutes: float = 0, hours: float = 0, days: float = 0) -> Interval:
    """A trigger due every so much elapsed time; the first slot is one period after the
    job's row is created (or ``first_run`` after it). Validated when the job registers."""
    return Interval(timedelta(seconds=seconds, minutes=minutes, hours=hours, days=days))


def cron(expression: str, tz: str | None = None) -> Cron:
    """A trigger due at the wall times a five-field cron expression matches in ``tz``
    (default: the TIMEZONE setting). Validated when the job registers."""
    return Cron(expression, tz)
