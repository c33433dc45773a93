"""The scheduler's exception hierarchy: one root, messages that say what to do."""

from __future__ import annotations

import reprlib

__all__ = [
    "InvalidJobError",
    "JobRowBusyError",
    "LeadershipLostError",
    "ScheduleNameCollisionError",
    "SchedulerError",
    "TriggerArgumentError",
]


class SchedulerError(Exception):
    """Root of every error the scheduler raises."""


class TriggerArgumentError(SchedulerError, ValueError):
    """Raised by ``cron()`` and ``every()`` at the call for an argument no trigger can be
    made of (``cron(None)``, ``cron('0 6 * * *', tz=5)``, ``every(seconds='5')``).
    ``argument`` names it, ``value`` is what was passed, ``limit`` what it must be. A
    ValueError too, as the triggers' other refusals are."""

    def __init__(self, argument: str, value: object, limit: str) -> None:
        self.argument = argument
        self.value = value
        self.limit = limit
        super().__init__(f"{argument}={reprlib.repr(value)} is refused: {limit}")


class InvalidJobError(SchedulerError):
    """Raised at registration when a job or service cannot be scheduled as declared.

    ``job_id`` names the offending job; the message says what to change.
    """

    def __init__(self, job_id: str, problem: str) -> None:
        self.job_id = job_id
        self.problem = problem
        super().__init__(f'job "{job_id}": {problem}')


class JobRowBusyError(SchedulerError):
    """A claim (or a registration) left a job out because another transaction holds its
    row, or the history row of its last run whose lease ran out and is to be reaped (a
    session left open on ``SELECT ... FOR UPDATE``, a stuck script): the leader never
    waits on a row it cannot lock, so that no other job waits with it. It tries the job
    again until the row is free; ``job_id`` names it."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(
            f"job {job_id!r}: another transaction holds its row (or its last run's row in "
            "scheduler_runs), so the leader left it out rather than wait on it (every "
            "other job fires); it is claimed once the row is free: end that transaction "
            "(the admin job list names a job row's backend pid, see pg_stat_activity)"
        )


class LeadershipLostError(SchedulerError):
    """Raised by ``ctx.fence()`` / ``ctx.fence_sync()`` when a newer leadership began
    after this run was claimed: its leader lost the key and another worker promoted.

    The fenced transaction was rolled back and must not be retried by the body: the new
    leader runs the job's next slot. ``run_term`` is the term the run was claimed under,
    ``current_term`` the one the database holds now.
    """

    def __init__(self, job_id: str, run_term: int, current_term: int) -> None:
        self.job_id = job_id
        self.run_term = run_term
        self.current_term = current_term
        super().__init__(
            f'job "{job_id}": its run was claimed under leadership term {run_term}, but '
            f"term {current_term} began since (this worker lost the leader key and another "
            "promoted); the transaction was rolled back, not committed: let this error end "
            "the run, the new leader runs the next slot"
        )


class ScheduleNameCollisionError(SchedulerError):
    """Two schedule names in one database derive the same advisory key (or a name is
    registered with another key than this code derives): their leaders would exclude
    each other. ``name`` and ``other`` are the two names."""

    def __init__(self, name: str, other: str) -> None:
        self.name = name
        self.other = other
        super().__init__(
            f"schedule names {name!r} and {other!r} derive the same leader key in this "
            f"database (table scheduler_schedules), so one would never lead while the "
            f"other does; rename one of them (Scheduler(name=...) or SCHEDULER_NAME)"
            if name != other
            else f"schedule {name!r} is registered in scheduler_schedules with another "
            "leader key than this code derives; delete its row there if no worker of an "
            "older release still runs it"
        )
