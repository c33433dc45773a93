"""Random expressions of the cron grammar (app/scheduler/cron_grammar.py) against an
oracle written from the grammar's text, without croniter or cron_grammar: the next
slots in UTC agree, and nothing but the grammar's own errors is raised. The classes one
by one are in test_cron_grammar.py; these mix them (lists of ranges, steps and names,
both day fields, L and #)."""

from __future__ import annotations

import calendar
import random
from collections.abc import Callable
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from app.scheduler import cron
from app.scheduler.cron_grammar import CronGrammarError

UTC_ZONE = ZoneInfo("UTC")
MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
LIMITS = {"minute": (0, 59), "hour": (0, 23), "dom": (1, 31), "month": (1, 12), "dow": (0, 7)}


def _val(field: str, token: str) -> int:
    t = token.lower()
    if field == "month" and t in MONTHS:
        return MONTHS.index(t) + 1
    if field == "dow" and t in DAYS:
        return DAYS.index(t)
    return int(t)


def _values(field: str, text: str) -> set[int]:
    low, high = LIMITS[field]
    out: set[int] = set()
    for item in text.split(","):
        base, _, step = item.partition("/")
        n = int(step) if step else 1
        if base == "*":
            a, b = low, high
        elif "-" in base:
            x, y = base.split("-")
            a = _val(field, x)
            # "mon-sun": Sunday ends a week
            b = 7 if field == "dow" and y.lower() == "sun" and a > 0 else _val(field, y)
        else:
            a = _val(field, base)
            b = high if step else a
        out.update(range(a, b + 1, n))
    if field == "dow":
        out = {d % 7 for d in out}
    return out


def _day_pred(dom: str, dow: str) -> Callable[[date], bool]:
    def dom_match(d: date) -> bool:
        if dom.upper() == "L":
            return d.day == calendar.monthrange(d.year, d.month)[1]
        return d.day in _values("dom", dom)

    def dow_match(d: date) -> bool:
        cron_dow = (d.weekday() + 1) % 7
        if "#" in dow:
            day, nth = dow.split("#")
            return cron_dow == _val("dow", day) % 7 and (d.day - 1) // 7 + 1 == int(nth)
        if dow.upper().endswith("L") and dow.upper() != "L":
            return (
                cron_dow == _val("dow", dow[:-1]) % 7
                and d.day + 7 > calendar.monthrange(d.year, d.month)[1]
            )
        return cron_dow in _values("dow", dow)

    if dom == "*":
        return dow_match
    if dow == "*":
        return dom_match
    return lambda d: dom_match(d) or dow_match(d)


def oracle_slots(expr: str, start: datetime, count: int, years: int = 12) -> list[datetime]:
    minute, hour, dom, month, dow = expr.split()
    minutes, hours, months = (
        _values("minute", minute),
        _values("hour", hour),
        _values("month", month),
    )
    pred = _day_pred(dom, dow)
    times = sorted(time(h, m) for h in hours for m in minutes)
    out: list[datetime] = []
    day = start.date()
    end = day + timedelta(days=366 * years)
    while day < end and len(out) < count:
        if day.month in months and pred(day):
            for t in times:
                at = datetime.combine(day, t, tzinfo=UTC)
                if at > start:
                    out.append(at)
                    if len(out) == count:
                        break
        day += timedelta(days=1)
    return out


def _item(rng: random.Random, field: str) -> str:
    low, high = LIMITS[field]
    names = MONTHS if field == "month" else DAYS if field == "dow" else None

    def v(x: int) -> str:
        if names and rng.random() < 0.3:
            if field == "month":
                return names[x - 1]
            if x <= 6:
                return names[x]
        return str(x)

    kind = rng.choice(["*", "v", "range", "step*", "stepv", "steprange"])
    if kind == "*":
        return "*"
    if kind == "v":
        return v(rng.randint(low, high))
    a = rng.randint(low, high)
    b = rng.randint(a, high)
    n = rng.randint(1, high - low + 1)
    if kind == "range":
        return f"{v(a)}-{v(b)}"
    if kind == "step*":
        return f"*/{n}"
    if kind == "stepv":
        return f"{v(a)}/{n}"
    return f"{v(a)}-{v(b)}/{n}"


def _field(rng: random.Random, field: str) -> str:
    if rng.random() < 0.35:
        return "*"
    if field == "dom" and rng.random() < 0.1:
        return "L"
    if field == "dow" and rng.random() < 0.15:
        return f"{rng.randint(0, 7)}#{rng.randint(1, 5)}"
    if field == "dow" and rng.random() < 0.1:
        return f"{rng.randint(0, 7)}L"
    return ",".join(_item(rng, field) for _ in range(rng.randint(1, 3)))


def _expressions(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        out.append(" ".join(_field(rng, f) for f in ("minute", "hour", "dom", "month", "dow")))
    return out


@pytest.mark.parametrize("seed", range(8))
def test_random_expressions_of_the_grammar_fire_where_an_oracle_says(seed: int) -> None:
    rng = random.Random(1000 + seed)
    disagreements: list[tuple[object, ...]] = []
    for expr in _expressions(seed, 60):
        start = datetime(
            rng.randint(1975, 2090),
            rng.randint(1, 12),
            rng.randint(1, 28),
            rng.randint(0, 23),
            rng.randint(0, 59),
            tzinfo=UTC,
        )
        expected = oracle_slots(expr, start, 6)
        try:
            trigger = cron(expr)
            trigger.validate()
        except (CronGrammarError, ValueError) as exc:
            if expected:
                disagreements.append((expr, "refused", str(exc)[:120]))
            continue
        got: list[datetime] = []
        moment = start
        for _ in range(len(expected)):
            moment = trigger.next_after(moment, UTC_ZONE)
            got.append(moment)
        if got != expected:
            disagreements.append((expr, start.isoformat(), got[:3], expected[:3]))
    assert disagreements == []
