"""What the scheduler runs: job and service specs, validated when they register.

A mistake in a declaration (a bad cron string, an unknown zone, a duplicate id, a
zero interval, something that is not callable) fails here, at import time, with the
job id in the message, never later at 3 a.m. in a log.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import InvalidJobError
from .triggers import Trigger

__all__ = ["JobSpec", "Registry", "ServiceSpec"]

JobFunc = Callable[..., Any]
ServiceFunc = Callable[..., Awaitable[None]]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _seconds(value: float | timedelta | None) -> float | None:
    if value is None:
        return None
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


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

    @property
    def is_async(self) -> bool:
        """True for ``async def`` jobs."""
        return inspect.iscoroutinefunction(self.func)

    def jitter_delay(self, slot: datetime) -> float:
        """Seconds to wait after ``slot`` before firing it, in [0, jitter).

        Drawn once per (job id, slot): a hash, not a random draw, so every wake-up of the
        job loop and every leader after a failover waits the same delay for the same
        slot, and the delays of successive slots spread uniformly over the jitter.
        """
        if not self.jitter:
            return 0.0
        micros = (slot - _EPOCH) // timedelta(microseconds=1)
        digest = hashlib.blake2b(f"{self.id}\x00{micros}".encode(), digest_size=8).digest()
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
        if not callable(func):
            raise InvalidJobError(id, f"{func!r} is not callable; decorate a function")
        if not isinstance(trigger, Trigger):
            raise InvalidJobError(
                id, f"trigger {trigger!r} is not a trigger; use every(...) or cron(...)"
            )
        try:
            trigger.validate()
        except ValueError as exc:
            raise InvalidJobError(id, str(exc)) from None
        options = {
            "first_run": _seconds(first_run),
            "timeout": _seconds(timeout),
            "jitter": _seconds(jitter),
            "misfire_grace": _seconds(misfire_grace),
        }
        for option, value in options.items():
            if value is not None and value < 0:
                raise InvalidJobError(id, f"{option} must not be negative, got {value:g} s")
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
        if not inspect.iscoroutinefunction(func):
            raise InvalidJobError(id, f"a service must be an async def function, got {func!r}")
        spec = ServiceSpec(id=id, name=name or id, func=func)
        self.services[id] = spec
        return spec

    def _check_id(self, job_id: object) -> None:
        if not isinstance(job_id, str) or not job_id.strip():
            raise InvalidJobError(str(job_id), "id must be a non-empty string")
        if job_id in self.jobs or job_id in self.services:
            raise InvalidJobError(
                job_id, "id is already registered; every job and service needs its own id"
            )
