"""The cron grammar Regent accepts, and the one meaning each accepted expression has.

Five fields: minute (0-59), hour (0-23), day-of-month (1-31), month (1-12 or jan-dec),
day-of-week (0-7 or sun-sat; 0 and 7 are Sunday). A field is ``*``, or a list (``,``)
of items, each a value, a range ``a-b`` (a <= b), or either with a step: ``*/n``,
``a-b/n``, and ``a/n`` (from a to the field's end). Besides, as a whole field:
``L`` in day-of-month (the month's last day); ``d#n`` in day-of-week (the n-th
weekday d of the month, n 1-5) and ``dL`` (the month's last weekday d).
``@yearly``, ``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight`` and
``@hourly`` stand for their five fields.

Days: when day-of-month and day-of-week are both other than ``*``, a day is due when
EITHER matches (the POSIX rule): ``0 9 10 * 1#2`` fires on the 10th and on second
Mondays. When either is ``*``, the other alone decides. A step (``*/2``) counts as a
restriction. Refused, naming the field: anything else, in particular croniter's
random ``R`` and hashed ``H`` (a random field would give another slot at each
evaluation: two leaders, or one before and after a restart, would disagree), the
nearest weekday ``W``/``LW``, ``?``, seconds or years (six or seven fields).

``parse`` checks an expression against this grammar and gives the croniter expressions
whose union is its schedule: one, or two when both day fields restrict (croniter keeps
only one of the two fields for ``#``, ``L`` and ``W`` combined with a day-of-month).
Ranges and steps other than ``*/n`` reach croniter as the values they name, so the
DST rule (``hour_is_elapsed_time``) is read from the expression as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable

__all__ = ["CronGrammarError", "hour_is_elapsed_time", "parse"]

MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# A field's name, lowest and highest value, and the names of its values in order.
_Field = tuple[str, int, int, tuple[str, ...]]
_FIELDS: tuple[_Field, ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day-of-month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _WEEKDAYS),
)
# Names match in any case; messages quote what was written.
_ITEM = re.compile(r"^(?P<base>\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(?P<step>[0-9]+))?$", re.I)
_NTH_WEEKDAY = re.compile(r"^(?P<day>[a-z0-9]+)#(?P<nth>[0-9]+)$", re.I)
_LAST_WEEKDAY = re.compile(r"^(?P<day>[a-z0-9]+)l$", re.I)
# Builds the error for one field from what is wrong with it.
_Refuse = Callable[[str], "CronGrammarError"]
_GRAMMAR = (
    "each field is *, a value, a range a-b, a step */n, a-b/n or a/n, or a list of "
    "those; day-of-month may be L, day-of-week d#n or dL"
)
# Forms other crons accept that Regent refuses (as a whole item of a field), and why.
_REFUSED = (
    (
        re.compile(r"r"),
        "uses R, a random value: each evaluation would give another slot, so two "
        "leaders would disagree; write the value you want",
    ),
    (re.compile(r"h"), "uses H, a hashed value, which Regent does not support; write a value"),
    (
        re.compile(r"(?:[0-9]*|l)w"),
        "uses W (nearest weekday), which Regent does not support; list the days instead",
    ),
    (re.compile(r"\?"), "uses ?, which Regent does not use; write *"),
)


class CronGrammarError(ValueError):
    """An expression outside the grammar; the message names the field and the fix."""


def parse(expression: str) -> tuple[str, ...]:
    """The croniter expressions (one or two) whose union of matching minutes is
    ``expression``'s schedule, normalized (numbers for names, ``dL`` written as
    croniter's ``Ld``, day-of-week ranges and steps as the days 0-6 they name). Raises
    CronGrammarError naming the field when the expression is outside the grammar above
    (a wrong type raises it too)."""
    if not isinstance(expression, str):
        raise CronGrammarError(
            f"cron expression {expression!r} is not a string; write e.g. cron('0 6 * * *')"
        )
    fields = MACROS.get(expression.strip().lower(), expression).split()
    if len(fields) != 5:
        raise CronGrammarError(
            f"cron expression {expression!r} has {len(fields)} fields; it needs five fields: "
            "minute hour day-of-month month day-of-week, e.g. '0 6 * * *'"
        )
    normalized = [
        _field(expression, spec, field) for spec, field in zip(_FIELDS, fields, strict=True)
    ]
    minute, hour, day_of_month, month, day_of_week = normalized
    if day_of_month != "*" and day_of_week != "*":
        return (
            f"{minute} {hour} {day_of_month} {month} *",
            f"{minute} {hour} * {month} {day_of_week}",
        )
    return (" ".join(normalized),)


def _field(expression: str, spec: _Field, text: str) -> str:
    name = spec[0]

    def refuse(problem: str) -> CronGrammarError:
        return CronGrammarError(f"cron expression {expression!r}: {name} field {text!r} {problem}")

    lowered = text.lower()
    for token in re.split(r"[,/#-]", lowered):
        for form, problem in _REFUSED:
            if form.fullmatch(token):
                raise refuse(problem)
    if name == "day-of-month" and lowered == "l":
        return "L"
    if name == "day-of-week":
        nth = _NTH_WEEKDAY.match(text)
        if nth is not None:
            count = int(nth["nth"])
            if not 1 <= count <= 5:
                raise refuse("asks for an occurrence outside 1-5 (write d#1 to d#5)")
            return f"{_value(nth['day'], spec, refuse) % 7}#{count}"
        last = _LAST_WEEKDAY.match(text)
        if last is not None:
            return f"L{_value(last['day'], spec, refuse) % 7}"
    items = [_item(item, spec, refuse) for item in text.split(",")]
    if name == "day-of-week" and lowered != "*":
        return _weekdays(items)
    return ",".join(items)


def _weekdays(items: list[str]) -> str:
    """Checked day-of-week items as the list of weekdays 0-6 they name. croniter reads
    a range starting at 7 as every day, and ``7`` is Sunday again: it is given plain
    days only."""
    days: set[int] = set()
    for token in ",".join(items).split(","):
        span, _, step = token.partition("/")
        first, _, last = span.partition("-")
        if span == "*":
            first, last = "0", "7"
        days.update(day % 7 for day in range(int(first), int(last or first) + 1, int(step or 1)))
    return ",".join(str(day) for day in sorted(days))


def _item(item: str, spec: _Field, refuse: _Refuse) -> str:
    name, low, high, _ = spec
    match = _ITEM.match(item)
    if match is None:
        raise refuse(f"is not in Regent's cron grammar: {_GRAMMAR}")
    base, step = match["base"], match["step"]
    if step is not None and not 1 <= int(step) <= high - low + 1:
        raise refuse(f"has step {step}, outside 1-{high - low + 1}")
    if base == "*":
        return "*" if step is None else f"*/{step}"
    first, dash, last = base.partition("-")
    start = _value(first, spec, refuse)
    if dash:
        # Sunday ends a week: mon-sun is 1-7 (and sun-sun is Sunday alone).
        sunday_ends = name == "day-of-week" and last.lower() == "sun" and start > 0
        end = 7 if sunday_ends else _value(last, spec, refuse)
        if end < start:
            raise refuse(f"has the range {base} running backwards; split it, e.g. 5-6,0-1")
    else:
        end = high if step is not None else start
    # Ranges and steps are handed over as the values they name: croniter's readings of
    # them differ between its versions (6.0 reads ``23/2`` as ``*/2``, 7.0 reads
    # ``23-23/2`` and ``3-3`` so), and one meaning in every process cannot depend on
    # the croniter a host installed.
    return ",".join(str(value) for value in range(start, end + 1, int(step or 1)))


def hour_is_elapsed_time(expression: str) -> bool:
    """Whether ``expression`` (one ``parse`` accepts) names its hours as elapsed time: an
    hour field that is ``*`` or has a step (``*/2``, ``0-23/2``, ``0/2``), whose slots
    fall in both occurrences of a wall hour a fall-back repeats; a field of fixed hours
    (``2``, ``1-3``, ``1,13``) fires in the first occurrence only."""
    hour = MACROS.get(expression.strip().lower(), expression).split()[1]
    return "*" in hour or "/" in hour


def _value(text: str, spec: _Field, refuse: _Refuse) -> int:
    _, low, high, names = spec
    if text.lower() in names:
        index = names.index(text.lower())
        return low + index if names is _MONTHS else index
    if not text.isdigit():
        known = f" or a name ({'-'.join((names[0], names[-1]))})" if names else ""
        raise refuse(f"has {text!r}, which is not a number{known}")
    value = int(text)
    if not low <= value <= high:
        raise refuse(f"has {value}, outside {low}-{high}")
    return value
