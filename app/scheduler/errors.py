"""The scheduler's exception hierarchy: one root, messages that say what to do."""

from __future__ import annotations

__all__ = ["InvalidJobError", "LeadershipLostError", "SchedulerError"]


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
