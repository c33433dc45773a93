"""The statuses a run of the history can have, by which operators filter it.

They are the values the database's check on ``scheduler_runs.status`` allows (a test
pins the two together): ``running``; how a run ended (``ok``, ``error``, ``timeout``,
``cancelled``); a slot claimed but not run (``skipped_overlap``: another body held the
running lease; ``missed``: a slot let pass); ``abandoned``, a run whose owner
died, reaped by the leader.
"""

from __future__ import annotations

from typing import Literal, get_args

from .errors import AdminError

__all__ = ["RUN_STATUSES", "RunStatus", "UnknownRunStatusError", "check_run_status"]

RunStatus = Literal[
    "running", "ok", "error", "timeout", "cancelled", "skipped_overlap", "missed", "abandoned"
]
RUN_STATUSES: tuple[str, ...] = get_args(RunStatus)


class UnknownRunStatusError(AdminError):
    """A history filter named a status no run can have; ``status_asked`` is it."""

    def __init__(self, status: str) -> None:
        self.status_asked = status
        allowed = ", ".join(repr(name) for name in RUN_STATUSES)
        super().__init__(f"no run has status {status!r}; a run's status is one of {allowed}")


def check_run_status(status: str | None) -> str | None:
    """``status`` when it is None (no filter) or one of RUN_STATUSES; raises
    UnknownRunStatusError (a 400) naming the allowed ones otherwise."""
    if status is not None and status not in RUN_STATUSES:
        raise UnknownRunStatusError(status)
    return status
