"""What the scheduler tells observers (metrics, tests): finished runs and role changes.

Observers are plain callables; one that raises is logged and never disturbs a run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Observers", "RunFinished"]

logger = logging.getLogger("app.scheduler")


@dataclass(frozen=True)
class RunFinished:
    """One slot's outcome: ok, error, timeout, cancelled, missed or skipped_overlap."""

    job_id: str
    status: str
    duration_seconds: float
    lateness_seconds: float


@dataclass
class Observers:
    """Callbacks for run outcomes and for this worker's role (``"leader"``, ...)."""

    on_run: list[Callable[[RunFinished], None]] = field(default_factory=list)
    on_role: list[Callable[[str], None]] = field(default_factory=list)

    def run_finished(self, event: RunFinished) -> None:
        """Tell every run observer."""
        for callback in self.on_run:
            self._call(callback, event)

    def role_changed(self, role: str) -> None:
        """Tell every role observer."""
        for callback in self.on_role:
            self._call(callback, role)

    @staticmethod
    def _call(callback: Callable[[Any], None], value: object) -> None:
        try:
            callback(value)
        except Exception:
            logger.warning("scheduler observer %r failed", callback, exc_info=True)
