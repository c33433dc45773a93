"""What ``Outbox(...)`` and ``enqueue`` accept, checked at the call, before anything is
written: each refusal is an OutboxArgumentError naming the argument and its limit.

A value the database would refuse (a NUL byte, a lone surrogate, a key past the unique
index's row size) or that a drain could never use (a ``batch_size`` of ``'10'``, a
backoff of NaN) would otherwise surface later, as a driver error inside the caller's
transaction or a drain that fails on every pass.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from app.scheduler import Clock, Scheduler
from app.scheduler.durations import finite_seconds
from app.scheduler.registry import MAX_SECONDS
from app.storable import INT32_MAX, is_storable_text

from .errors import OutboxArgumentError

__all__ = [
    "MAX_KEY_BYTES",
    "MAX_NAME_LENGTH",
    "check_count",
    "check_deliver",
    "check_key",
    "check_name",
    "check_scheduler",
    "check_seconds",
    "check_table",
    "deliver_when",
]

# The drain job is ``outbox_<name>_drain`` and the wake-up ``outbox_<name>_wakeup``;
# a scheduler id is at most 200 characters (app/scheduler/registry.py ID_PATTERN).
MAX_NAME_LENGTH = 200 - len("outbox__wakeup")
"""The longest outbox name: its drain job's and wake-up's ids must be scheduler ids."""

_NAME = re.compile(rf"[A-Za-z0-9_]{{1,{MAX_NAME_LENGTH}}}")

MAX_KEY_BYTES = 2048
"""The longest key, in UTF-8 bytes. A row of the unique index on (outbox, key) holds at
most about 2700 bytes (a third of a page); this leaves room for the longest name."""

_TEN_YEARS = timedelta(seconds=MAX_SECONDS)


def check_name(name: object) -> str:
    """``name`` when it is 1 to MAX_NAME_LENGTH ASCII letters, digits and underscores: what
    the admin routes, the CLI and the scheduler's ids can address."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise OutboxArgumentError(
            "name",
            name,
            f"an outbox name is 1 to {MAX_NAME_LENGTH} ASCII letters, digits and underscores"
            " (A-Z, a-z, 0-9, _), so the admin page, its API and the CLI can address it",
        )
    return name


def check_deliver(name: str, deliver: object) -> None:
    """Raise unless ``deliver`` is an async function or an object with an async
    ``__call__`` (such as HttpTransport). A plain function would send the message and
    then fail the attempt (its result cannot be awaited): every retry a second send."""
    call = getattr(deliver, "__call__", None)  # noqa: B004 - the method itself is checked
    if not (inspect.iscoroutinefunction(deliver) or inspect.iscoroutinefunction(call)):
        raise OutboxArgumentError(
            "deliver",
            deliver,
            f"outbox {name!r} needs an async callable that takes a Message (an async def,"
            " or HttpTransport(url)); wrap a plain function in an async def",
        )


def check_scheduler(name: str, scheduler: object) -> None:
    """Raise unless ``scheduler`` is a Scheduler, the one the drain job and the wake-up
    are put on."""
    if not isinstance(scheduler, Scheduler):
        raise OutboxArgumentError(
            "scheduler",
            scheduler,
            f"outbox {name!r} is drained by a job on a Scheduler: pass the app's"
            " Scheduler (Outbox(..., scheduler=scheduler) or outbox.register(scheduler))",
        )


def check_count(name: str, argument: str, value: object, *, optional: bool = False) -> None:
    """Raise unless ``value`` is an int from 1 to INT32_MAX (or None when ``optional``)."""
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= INT32_MAX:
        raise OutboxArgumentError(
            argument, value, f"outbox {name!r}: {argument} must be an int from 1 to {INT32_MAX}"
        )


def check_seconds(name: str, argument: str, value: object, *, above_zero: bool = False) -> float:
    """``value`` (a number or a timedelta) as seconds, when it is finite, from 0 (above
    0 when ``above_zero``) and at most ten years; raise otherwise."""
    seconds = finite_seconds(value)
    if seconds is None or seconds > MAX_SECONDS or seconds < 0 or (above_zero and not seconds):
        floor = "above zero" if above_zero else "from 0"
        raise OutboxArgumentError(
            argument,
            value,
            f"outbox {name!r}: {argument} must be a finite number of seconds {floor}"
            f" and at most {MAX_SECONDS:g} (ten years)",
        )
    return seconds


def check_table(name: str, argument: str, values: object) -> tuple[float, ...]:
    """``values`` as a tuple of seconds: a non-empty sequence of finite numbers from 0 to
    ten years."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
        raise OutboxArgumentError(
            argument,
            values,
            f"outbox {name!r}: {argument} must be a non-empty list of delays in seconds,"
            " e.g. [5, 15, 60]",
        )
    return tuple(check_seconds(name, f"{argument}[{i}]", value) for i, value in enumerate(values))


def check_key(name: str, key: object) -> str:
    """``key`` when PostgreSQL can store it in the unique index: a non-empty str with no
    NUL character or lone surrogate, of at most MAX_KEY_BYTES in UTF-8."""
    if not isinstance(key, str) or not key:
        raise OutboxArgumentError("key", key, f"outbox {name!r}: key must be a non-empty str")
    if not is_storable_text(key):
        raise OutboxArgumentError(
            "key",
            key,
            f"outbox {name!r}: a key must not contain a NUL character or a lone UTF-16"
            " surrogate, which PostgreSQL cannot store; encode it (e.g. a hash or"
            " urllib.parse.quote) before enqueueing",
        )
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise OutboxArgumentError(
            "key",
            key,
            f"outbox {name!r}: a key is at most {MAX_KEY_BYTES} bytes of UTF-8 (the unique"
            f" index on (outbox, key) holds no longer), got {len(key.encode('utf-8'))};"
            " enqueue a hash of it (hashlib.sha256(...).hexdigest())",
        )
    return key


def deliver_when(
    name: str, at: object, delay: object, clock: Clock
) -> tuple[datetime | None, timedelta]:
    """``(at, delay)`` for the insert: an aware moment, or None and a delay from 0 to ten
    years (zero: due at once). ``at`` must be aware and at most ten years past
    ``clock.now()`` and within UTC's years 1 to 9999; both at once is refused."""
    if at is not None and delay is not None:
        raise OutboxArgumentError(
            "at",
            at,
            f"outbox {name!r}: pass at= (a moment) or delay= (a timedelta), not both",
        )
    if at is not None:
        if not isinstance(at, datetime) or at.utcoffset() is None:
            raise OutboxArgumentError(
                "at",
                at,
                f"outbox {name!r}: at must be a timezone-aware datetime (e.g."
                " datetime(2030, 1, 1, 9, tzinfo=ZoneInfo('Europe/Zurich'))); a naive one"
                " has no moment",
            )
        try:
            at.astimezone(UTC)
        except OverflowError:
            # datetime.min east of UTC: before year 1 in UTC, which no driver can send.
            raise OutboxArgumentError(
                "at",
                at,
                f"outbox {name!r}: at must fall within years 1 to 9999 in UTC",
            ) from None
        if at - clock.now() > _TEN_YEARS:
            raise OutboxArgumentError(
                "at",
                at,
                f"outbox {name!r}: at must be at most ten years ahead ({MAX_SECONDS:g} s)",
            )
        return at, timedelta(0)
    if delay is None:
        return None, timedelta(0)
    if not isinstance(delay, timedelta) or not timedelta(0) <= delay <= _TEN_YEARS:
        raise OutboxArgumentError(
            "delay",
            delay,
            f"outbox {name!r}: delay must be a timedelta from 0 to ten years (e.g."
            " timedelta(hours=1))",
        )
    return None, delay
