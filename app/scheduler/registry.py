"""What the scheduler runs: job and service specs, validated when they register.

A mistake in a declaration (a bad cron string, an unknown zone, a duplicate id, a
zero interval, something that is not callable) fails here, at import time, with the
job id in the message, never later at 3 a.m. in a log.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from zoneinfo import ZoneInfo

from .durations import finite_seconds
from .errors import InvalidJobError
from .triggers import Trigger

__all__ = ["ID_PATTERN", "MAX_SECONDS", "JobSpec", "Registry", "ServiceSpec"]

JobFunc = Callable[..., Any]
ServiceFunc = Callable[..., Awaitable[None]]

# Every id must be addressable by the admin routes and the CLI, and printable in a log.
# Not dots alone: a browser resolves a path segment of "." or ".." (encoded or not), so
# no URL of the admin page could reach such a job.
ID_PATTERN = r"^(?!\.+$)[A-Za-z0-9_.:-]{1,200}$"
_ID = re.compile(ID_PATTERN)
_NAME_LIMIT = 200
# Ten years: beyond it a duration is a typo, and datetime arithmetic would overflow.
MAX_SECONDS = 10 * 366 * 86400.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MIN_GRACE_SECONDS = 1.0
# How many slots (from a fixed moment) the shortest gap is looked for among.
_GAP_SAMPLE = 200


def _shortest_gap(trigger: Trigger) -> float:
    """The shortest time between two consecutive slots among the first _GAP_SAMPLE
    (from a fixed moment, in UTC), in seconds."""
    zone = ZoneInfo("UTC")
    slot = trigger.next_after(_EPOCH.replace(year=2000), zone)
    shortest = float("inf")
    for _ in range(_GAP_SAMPLE):
        following = trigger.next_after(slot, zone)
        shortest = min(shortest, (following - slot).total_seconds())
        slot = following
    return shortest


def _seconds(job_id: str, option: str, value: object) -> float | None:
    """``value`` as seconds; raises InvalidJobError unless it is None or a finite number
    from 0 to MAX_SECONDS."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, timedelta | int | float):
        raise InvalidJobError(
            job_id, f"{option} must be a number of seconds or a timedelta, got {value!r}"
        )
    seconds = finite_seconds(value)
    if seconds is None or not 0 <= seconds <= MAX_SECONDS:
        raise InvalidJobError(
            job_id,
            f"{option} must be a number of seconds from 0 to {MAX_SECONDS:g} (ten years), "
            f"got {value!r}",
        )
    return seconds


def _check_takes_the_context(job_id: str, func: object) -> None:
    """Raise InvalidJobError when ``func`` cannot be called with one argument, the
    JobContext (a callable whose signature cannot be read is given the benefit)."""
    try:
        signature = inspect.signature(func)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return
    try:
        signature.bind(None)
    except TypeError:
        raise InvalidJobError(
            job_id,
            f"{getattr(func, '__name__', func)!r}{signature} cannot be called with the job's "
            "context; declare it as `async def job(ctx: JobContext) -> None` (or `def`)",
        ) from None


def _is_async(func: object) -> bool:
    """True for an ``async def``, a partial of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(
        getattr(func, "__call__", None)  # noqa: B004
    )


@dataclass(frozen=True)
class JobSpec:
    """One registered job. ``is_async`` jobs run on the loop, the rest in a thread.

    Times are seconds. ``first_run``: the first slot is this long after the job's row is
    created (once per row; per worker boot for a ``leader_only=False`` job), instead of
    the trigger's first slot. ``jitter``: see ``jitter_delay``.
    """

    id: str
    name: str
    func: JobFunc
    trigger: Trigger
    leader_only: bool = True
    first_run: float | None = None
    timeout: float | None = None
    jitter: float = 0.0
    misfire_grace: float | None = None
    # Worked out at registration, not per fire: a thundering slot starts a thousand
    # bodies at once, and inspect and a first getLogger are slow. ``is_async``: an
    # ``async def`` (or an object with an ``async def __call__``); ``logger``:
    # ``regent.job.<id>``, which its context logs through.
    is_async: bool = field(init=False, repr=False, compare=False)
    logger: logging.Logger = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", _is_async(self.func))
        object.__setattr__(self, "logger", logging.getLogger(f"regent.job.{self.id}"))

    def jitter_delay(self, slot: datetime, *, salt: str = "") -> float:
        """Seconds to wait after ``slot`` before firing it, in [0, jitter).

        Drawn once per (job id, slot): a hash, not a random draw, so every wake-up of the
        job timer and every leader after a failover waits the same delay for the same
        slot, and the delays of successive slots spread uniformly over the jitter.
        ``salt`` spreads the workers of a ``leader_only=False`` job apart (their pid).
        """
        if not self.jitter:
            return 0.0
        micros = (slot - _EPOCH) // timedelta(microseconds=1)
        key = f"{self.id}\x00{micros}" + (f"\x00{salt}" if salt else "")
        digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
        return self.jitter * int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class ServiceSpec:
    """A long-running coroutine that runs only while this worker leads."""

    id: str
    name: str
    func: ServiceFunc


class Registry:
    """The jobs and services of one Scheduler, keyed by id."""

    def __init__(self) -> None:
        self.jobs: dict[str, JobSpec] = {}
        self.services: dict[str, ServiceSpec] = {}

    def add_job(
        self,
        func: object,
        trigger: object,
        *,
        id: str,
        name: str | None,
        leader_only: bool,
        first_run: float | timedelta | None,
        timeout: float | timedelta | None,
        jitter: float | timedelta | None,
        misfire_grace: float | timedelta | None,
    ) -> JobSpec:
        """Validate and store a job. Raises InvalidJobError naming the id and the fix."""
        self._check_id(id)
        self._check_name(id, name)
        if not callable(func):
            raise InvalidJobError(id, f"{func!r} is not callable; decorate a function")
        if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
            raise InvalidJobError(
                id,
                f"{func!r} is an async generator or a generator, whose body would never "
                "run; declare the job as `async def` (or `def`) returning None",
            )
        _check_takes_the_context(id, func)
        if not isinstance(leader_only, bool):
            raise InvalidJobError(id, f"leader_only must be True or False, got {leader_only!r}")
        if not isinstance(trigger, Trigger):
            raise InvalidJobError(
                id, f"trigger {trigger!r} is not a trigger; use every(...) or cron(...)"
            )
        try:
            trigger.validate()
        except ValueError as exc:
            raise InvalidJobError(id, str(exc)) from None
        options = {
            "first_run": _seconds(id, "first_run", first_run),
            "timeout": _seconds(id, "timeout", timeout),
            "jitter": _seconds(id, "jitter", jitter),
            "misfire_grace": _seconds(id, "misfire_grace", misfire_grace),
        }
        grace = options["misfire_grace"]
        if grace is not None and grace < _MIN_GRACE_SECONDS:
            raise InvalidJobError(
                id,
                f"misfire_grace must be at least {_MIN_GRACE_SECONDS:g} s, got {grace:g}: "
                "every fire wakes a few milliseconds after its slot, so a smaller grace "
                "misses every slot; use None to run late slots, once",
            )
        jitter_value = options["jitter"]
        if jitter_value:
            gap = _shortest_gap(trigger)
            if jitter_value >= gap:
                raise InvalidJobError(
                    id,
                    f"jitter ({jitter_value:g} s) must be shorter than the shortest gap between "
                    f"two slots ({gap:g} s), or a jittered fire would land after the next slot",
                )
        if options["timeout"] == 0:
            raise InvalidJobError(id, "timeout must be above zero, or None for no timeout")
        spec = JobSpec(
            id=id,
            name=name or id,
            func=func,
            trigger=trigger,
            leader_only=leader_only,
            first_run=options["first_run"],
            timeout=options["timeout"],
            jitter=options["jitter"] or 0.0,
            misfire_grace=options["misfire_grace"],
        )
        self.jobs[id] = spec
        return spec

    def add_service(self, func: object, *, id: str, name: str | None) -> ServiceSpec:
        """Validate and store a service. Raises InvalidJobError naming the id and the fix."""
        self._check_id(id)
        self._check_name(id, name)
        if not _is_async(func):
            raise InvalidJobError(id, f"a service must be an async def function, got {func!r}")
        spec = ServiceSpec(id=id, name=name or id, func=cast(ServiceFunc, func))
        self.services[id] = spec
        return spec

    def _check_id(self, job_id: object) -> None:
        if not isinstance(job_id, str) or not _ID.fullmatch(job_id):
            printable = isinstance(job_id, str) and job_id.isprintable()
            raise InvalidJobError(
                str(job_id) if printable else repr(job_id),
                "id must be 1 to 200 characters of A-Z, a-z, 0-9, '_', '.', ':' or '-', "
                "not dots alone, so the admin page, its API and the CLI can address it",
            )
        if job_id in self.jobs or job_id in self.services:
            raise InvalidJobError(
                job_id, "id is already registered; every job and service needs its own id"
            )

    @staticmethod
    def _check_name(job_id: str, name: object) -> None:
        if name is None:
            return
        if (
            not isinstance(name, str)
            or not name.strip()
            or len(name) > _NAME_LIMIT
            or not name.isprintable()
        ):
            raise InvalidJobError(
                job_id,
                f"name must be printable text of 1 to {_NAME_LIMIT} characters (it is the "
                f"log string monitors match on), got {name!r}",
            )
