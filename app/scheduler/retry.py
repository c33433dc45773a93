"""Every retry policy of the scheduler, each one app.backoff.Backoff, and the log line
that says a retry is coming.

One table per purpose, so what the scheduler does after a failure is read here and
nowhere else: reaching the database (the supervisor, a per-worker job's loop, a lease
renewal), restarting a crashed service or supervisor, writing an outcome again, trying
a broken job again.
"""

from __future__ import annotations

import logging
import os

from app.backoff import Backoff

__all__ = [
    "BROKEN_JOB",
    "BUSY_ROW",
    "DATABASE",
    "OUTCOME_WRITE",
    "SERVICE_RESTART",
    "SUPERVISOR_RESTART",
    "log_retry",
    "renewal_delay",
]

logger = logging.getLogger("app.scheduler")

# Reaching the database: capped low, since after PostgreSQL returns a leader must be
# back well within a lease.
DATABASE = Backoff((0.5, 1.0, 2.0, 4.0, 5.0))
# A job whose row another transaction holds is claimed again this soon (never more
# than a leader tick apart): a row held for a moment costs its slot a moment.
BUSY_ROW = Backoff((0.5, 1.0, 2.0, 4.0, 5.0))
# A service that crashed or returned while its worker leads is started again.
SERVICE_RESTART = Backoff((1.0, 2.0, 5.0, 10.0, 30.0, 60.0))
# A supervisor that crashed (a bug, never a database outage, which it retries itself).
SUPERVISOR_RESTART = Backoff((5.0,))
# An outcome write cut off by a lost connection is written again, soon: until it lands
# the run reads 'running'.
OUTCOME_WRITE = Backoff((0.05, 0.1, 0.2, 0.4, 0.8))
# A job whose step fails while the database answers (its trigger raised, its row
# refused the statement) is tried again this often; its other jobs are never held up.
BROKEN_JOB = Backoff((60.0,))


def renewal_delay(period: float, failures: int) -> float:
    """Seconds until the next renewal of a running lease renewed every ``period``
    seconds, after ``failures`` failed renewals in a row: the period after a success,
    else the DATABASE backoff (never above the period). A renewal retried only a period
    later lets two passing failures use up the whole margin of a lease of three periods:
    the third attempt would fall at the lease's very end."""
    if failures == 0:
        return period
    return min(period, DATABASE.delay(failures))


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
