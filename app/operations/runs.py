"""A job's runs as operators read them: its history, paged and filtered by status, and
the run a run-now request became.

Shared by the admin API, the admin page and the CLI; raises AdminError subclasses whose
messages name the problem.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.keys import DEFAULT_SCHEDULE

from .jobs import require_job
from .reading import plain_rows
from .run_status import check_run_status

__all__ = ["job_runs", "manual_run"]

# A run as operators read it: in the history and as a run-now request's outcome.
_RUN_COLUMNS = """r.id, r.slot, r.started_at, r.finished_at, r.status, r.lateness_ms,
        r.duration_ms, r.pid, r.host, r.error, r.manual"""
# A page of a job's runs, newest first: read through (schedule, job_id, id DESC), or,
# filtered by status, through (schedule, job_id, status, id DESC) (migration 0024), so
# that a status the job rarely has costs the page, not a scan of the job's history.
# Two statements rather than "status IS NULL OR": a generic plan cannot drop that OR.
_RUNS_PAGE = f"""
    SELECT {_RUN_COLUMNS}
    FROM scheduler_runs r
    WHERE r.schedule = :schedule AND r.job_id = :job_id {{status}}
        AND (CAST(:before AS bigint) IS NULL OR r.id < :before)
    ORDER BY r.id DESC LIMIT :limit
    """
_RUNS = text(_RUNS_PAGE.format(status=""))
_RUNS_OF_STATUS = text(_RUNS_PAGE.format(status="AND r.status = :status"))
# The manual run a request (its time, the run's slot) became.
_MANUAL_RUN = text(
    f"""
    SELECT {_RUN_COLUMNS}
    FROM scheduler_runs r
    WHERE r.schedule = :schedule AND r.job_id = :job_id AND r.manual AND r.slot = :slot
    ORDER BY r.id DESC LIMIT 1
    """
)


async def job_runs(
    engine: AsyncEngine,
    job_id: str,
    *,
    limit: int = 50,
    before: int | None = None,
    schedule: str = DEFAULT_SCHEDULE,
    status: str | None = None,
) -> list[dict[str, Any]]:
    """A page of the job's runs, newest first, only those of ``status`` when it is
    given; ``before`` is the last id of the previous page. Raises UnknownJobError (a
    NotFound) for an unknown job, UnknownRunStatusError (a 400) for a status no run can
    have (run_status.RUN_STATUSES)."""
    check_run_status(status)
    async with engine.connect() as conn:
        await require_job(conn, job_id, schedule)
        params = {
            "job_id": job_id,
            "limit": limit,
            "before": before,
            "schedule": schedule,
            "status": status,
        }
        result = await conn.execute(_RUNS if status is None else _RUNS_OF_STATUS, params)
        return plain_rows(result)


async def manual_run(
    engine: AsyncEngine, job_id: str, requested: datetime, *, schedule: str = DEFAULT_SCHEDULE
) -> dict[str, Any] | None:
    """The run that the run-now request of ``requested`` (what run_job_now returned)
    became, as job_runs gives it; None while the leader has not claimed it."""
    params = {"job_id": job_id, "slot": requested, "schedule": schedule}
    async with engine.connect() as conn:
        rows = plain_rows(await conn.execute(_MANUAL_RUN, params))
    return rows[0] if rows else None
