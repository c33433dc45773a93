"""Backoff between attempts to reach the database, and the log line that says so."""

from __future__ import annotations

import logging
import os

__all__ = ["RETRY_BACKOFF", "backoff_delay", "log_retry", "renewal_delay"]

logger = logging.getLogger("app.scheduler")

# Capped low: after PostgreSQL returns, a leader must be back well within a lease.
RETRY_BACKOFF = (0.5, 1.0, 2.0, 4.0, 5.0)


def backoff_delay(failures: int) -> float:
    """Seconds to wait after ``failures`` failed attempts in a row (0-based)."""
    return RETRY_BACKOFF[min(failures, len(RETRY_BACKOFF) - 1)]


def renewal_delay(period: float, failures: int) -> float:
    """Seconds until the next renewal of a running lease renewed every ``period``
    seconds, after ``failures`` failed renewals in a row: the period after a success,
    else the short backoff (never above the period). A renewal retried only a period
    later lets two passing failures use up the whole margin of a lease of three periods:
    the third attempt would fall at the lease's very end."""
    if failures == 0:
        return period
    return min(period, backoff_delay(failures - 1))


def log_retry(action: str, exc: BaseException, delay: float) -> None:
    """One warning naming the action, the error and when the next attempt is."""
    logger.warning(
        "%s: %s: %s; retrying in %s s (pid=%s)",
        action,
        exc.__class__.__name__,
        exc,
        delay,
        os.getpid(),
        extra={"action": action, "pid": os.getpid()},
    )
