"""How a supervisor elects and leads (SchedulerConfig), and the roles it passes through."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

from .keys import DEFAULT_SCHEDULE, validate_schedule_name

__all__ = ["Role", "SchedulerConfig"]


class Role(enum.Enum):
    """What this worker is doing with the schedule right now."""

    STARTING = "starting"
    STANDBY = "standby"
    LEADER = "leader"
    UNGUARDED = "unguarded"
    STOPPED = "stopped"


@dataclass(frozen=True)
class SchedulerConfig:
    """How the supervisor elects and leads. Times are seconds.

    ``fail_closed``: a lock-check error starts no scheduler (production); otherwise the
    worker runs unguarded for one backoff period, its claims still firing each slot once.

    ``host_lock_dir``: the runtime directory of this host's lock file (host_lock.py);
    only the worker holding its flock opens a lock connection. None: every worker
    queues in PostgreSQL itself.

    ``schedule``: the schedule name of a Scheduler created without one (SCHEDULER_NAME).

    ``simulated_workers``: several Schedulers of one name in this process stand for
    several workers (tests, benchmarks); otherwise a second one is refused at start.

    ``claim_ahead_seconds``: a leader claims the slots due within this lead before they
    are due, holding their rows in a transaction it commits at the slot, so that
    however many jobs share a slot their bodies start on time. A leadership lost or
    stepped down before the slot rolls the claim back (the next leader runs the slot);
    a pause written during the lead waits for the commit and takes effect from the
    next slot; an operator's write to a prepared job's row (a pause, a run-now) waits
    for that commit, at most the lead. 0.5 s by default (the lease is at least 2 s, so
    it always fits); 0 claims each slot when it is due.
    """

    lock_dsn: str
    zone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    lease_seconds: int = 30
    leader_tick_seconds: float = 5
    handover_grace_seconds: float = 1
    shutdown_grace_seconds: float = 10
    connect_timeout_seconds: float = 10
    fail_closed: bool = False
    host_lock_dir: Path | None = None
    schedule: str = DEFAULT_SCHEDULE
    simulated_workers: bool = False
    claim_ahead_seconds: float = 0.5

    def __post_init__(self) -> None:
        validate_schedule_name(self.schedule)
        if self.lease_seconds < 2:
            raise ValueError("lease_seconds must be at least 2")
        if not 0 < self.leader_tick_seconds * 2 <= self.lease_seconds:
            raise ValueError("leader_tick_seconds must be above zero and at most half the lease")
        if not 0 <= self.claim_ahead_seconds <= self.lease_seconds / 4:
            raise ValueError(
                f"claim_ahead_seconds must be between 0 and a quarter of the lease "
                f"({self.lease_seconds / 4:g} s); got {self.claim_ahead_seconds!r}"
            )
