"""Run-history retention: a schedule's old runs deleted in short batches.

A run row goes once it started more than ``days`` ago on the lease clock (the
database server's, or a test's FakeClock; never the host's) *and* at least ``keep``
newer runs of its job exist, so a job that runs once a month keeps its last ``keep``
runs however old they are. A run still marked ``running`` never goes, whatever its age:
its lease holds (the body runs) or its reaper has yet to record it ``abandoned``. Nor
does a run that still holds a running lease whatever its status (its row's
``running_until``, or its job row naming it): a thread body past its timeout has its
outcome recorded and runs on, renewing the lease on that row, and with the row gone
the renewal would find the lease lost and another run could start beside the body.

Each batch is one statement that locks at most ``batch`` rows with SKIP LOCKED and
deletes them, committed on its own: no lock is held longer than that statement, a row
another transaction holds (a run's outcome being written) is left for the next pass,
and a pass killed mid-way has committed every batch before the kill, so the next pass
simply finds less to delete. The keep-last bound of each job is read by the same
statement; a run recorded meanwhile only moves the bound up, so a batch never deletes
one of a job's ``keep`` newest runs. The walk follows ``scheduler_runs_started``
(schedule, started_at) from the oldest start and stops at the cutoff.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from ..clock import LEASE_NOW_SQL

__all__ = ["count_prunable_runs", "prune_runs_batch"]

# The cutoff is read once (a scalar subquery) so that it bounds the index scan. Each
# job's keep-last bound is computed once per statement (MATERIALIZED) and looked up per
# candidate row: joined instead, the planner walked every job's prunable runs and sorted
# them (a second per batch with half a million runs) rather than the started_at index
# up to the batch's size (milliseconds).
_PRUNABLE = f"""
    WITH kept AS MATERIALIZED (
        SELECT j.id AS job_id, j.running_run_id, (
            SELECT k.id FROM scheduler_runs k
            WHERE k.schedule = j.schedule AND k.job_id = j.id
            ORDER BY k.id DESC OFFSET CAST(:keep AS integer) - 1 LIMIT 1) AS oldest_kept
        FROM scheduler_jobs j WHERE j.schedule = :schedule
    )
    SELECT r.id FROM scheduler_runs r
    WHERE r.schedule = :schedule
        AND r.started_at < (SELECT {LEASE_NOW_SQL}
            - make_interval(secs => CAST(:days AS double precision) * 86400))
        AND r.status <> 'running' AND r.running_until IS NULL
        AND r.id < (SELECT kept.oldest_kept FROM kept WHERE kept.job_id = r.job_id)
        AND r.id IS DISTINCT FROM (
            SELECT kept.running_run_id FROM kept WHERE kept.job_id = r.job_id)
    """

_PRUNE_BATCH = text(
    f"""
    DELETE FROM scheduler_runs WHERE id IN (
        {_PRUNABLE} ORDER BY r.started_at LIMIT :batch FOR UPDATE OF r SKIP LOCKED)
    """
)

_COUNT = text(f"SELECT count(*) FROM ({_PRUNABLE}) prunable")


def _params(schedule: str, days: float, keep: int, lease_now: datetime | None) -> dict[str, object]:
    if keep < 1:
        # Internal invariant: Settings bounds RUN_HISTORY_KEEP; a job's last run is what
        # the job list's lateness reads.
        raise ValueError(f"keep must be at least 1, got {keep}")
    return {"schedule": schedule, "days": days, "keep": keep, "lease_now": lease_now}


async def prune_runs_batch(
    session: AsyncSession,
    *,
    schedule: str,
    days: float,
    keep: int,
    batch: int,
    lease_now: datetime | None = None,
) -> int:
    """Delete at most ``batch`` prunable runs of ``schedule`` (see the module docstring)
    in one transaction of one statement, committed before this returns; the number
    deleted. Fewer than ``batch`` means none was left (bar rows held elsewhere).
    ``lease_now`` as clock.lease_now gives it (None: the database server's clock)."""
    async with session.begin():
        params = _params(schedule, days, keep, lease_now) | {"batch": batch}
        result = await session.execute(_PRUNE_BATCH, params)
    deleted: int = result.rowcount  # type: ignore[attr-defined]
    return deleted


async def count_prunable_runs(
    session: AsyncSession,
    *,
    schedule: str,
    days: float,
    keep: int,
    lease_now: datetime | None = None,
) -> int:
    """How many runs of ``schedule`` a prune would delete now; deletes nothing."""
    async with session.begin():
        result = await session.execute(_COUNT, _params(schedule, days, keep, lease_now))
        count: int = result.scalar_one()
    return count
