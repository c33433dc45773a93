"""The scheduler's exception hierarchy: one root, messages that say what to do."""

from __future__ import annotations

__all__ = ["InvalidJobError", "SchedulerError"]


class SchedulerError(Exception):
    """Root of every error the scheduler raises."""


class InvalidJobError(SchedulerError):
    """Raised at registration when a job or service cannot be scheduled as declared.

    ``job_id`` names the offending job; the message says what to change.
    """

    def __init__(self, job_id: str, problem: str) -> None:
        self.job_id = job_id
        self.problem = problem
        super().__init__(f'job "{job_id}": {problem}')
