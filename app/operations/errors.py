"""Admin errors: each carries the HTTP status it answers with and a message that names
the problem."""

from __future__ import annotations

from ..invocation import program

__all__ = ["AdminError", "Conflict", "NotFound", "RetiredJobError", "UnknownJobError"]


class AdminError(Exception):
    """Root of the admin errors; ``status`` is the HTTP answer."""

    status = 400


class NotFound(AdminError):
    """An unknown job, outbox or message."""

    status = 404


class UnknownJobError(NotFound):
    """No job of that id in the schedule asked about; ``job_id`` and ``schedule`` name
    them."""

    def __init__(self, job_id: str, schedule: str) -> None:
        self.job_id = job_id
        self.schedule = schedule
        super().__init__(
            f"no job with id {job_id!r} in schedule {schedule!r}; `{program()} jobs "
            f"--schedule {schedule}` lists them"
        )


class Conflict(AdminError):
    """The request is valid but the state forbids it (a running job, a delivered row, a
    row a drain is delivering)."""

    status = 409


class RetiredJobError(Conflict):
    """A run now, pause or resume of a retired job (its schedule's leader registers it
    no more, so nothing would act on it); ``job_id`` and ``schedule`` name it, and the
    message names the command that removes it."""

    def __init__(self, job_id: str, schedule: str) -> None:
        self.job_id = job_id
        self.schedule = schedule
        super().__init__(
            f"job {job_id!r} is retired: the leader of schedule {schedule!r} no longer "
            "registers it, so nothing would act on it; register it again, or remove it "
            f"with `{program()} jobs forget {job_id} --schedule {schedule}`"
        )
