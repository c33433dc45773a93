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
one of a job's ``keep`` newest runs. The walk goes job by job, each from its oldest
run, and stops at the job's keep-last bound and at the schedule's last run before the
cutoff: what a batch reads is what it deletes, plus one probe per job, however much
old history keep-last holds.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from ..clock import LEASE_NOW_SQL

__all__ = ["count_prunable_runs", "prune_runs_batch"]


# Each job's runs are walked by id (scheduler_runs_job_recent), from its oldest up to the
# lower of two bounds: its keep-last bound (the id of its ``keep``-th newest run, read
# when the walk reaches the job) and the last run of the schedule that started before
# the cutoff (ids follow start times; a run whose start is out of step with its id, a
# clock that was ahead, bounds nothing). Jobs are taken one after another until the
# batch is full, in no order of age: a batch deletes prunable rows, and reads little
# more than it deletes, with one probe per job it reaches, however much old history
# keep-last holds (the walk along started_at read every rare job's kept runs again at
# each batch) and however many busy jobs there are (taking the oldest across all jobs
# read a batch's worth of each). ``started_at`` is still checked on every row: ids and
# start times agree to within a commit.
def _candidates(limit: str) -> str:
    return f"""
        WITH cutoff AS MATERIALIZED (
            SELECT {LEASE_NOW_SQL}
                - make_interval(secs => CAST(:days AS double precision) * 86400) AS at
        ), bound AS MATERIALIZED (
            SELECT COALESCE((
                SELECT r.id FROM scheduler_runs r
                WHERE r.schedule = :schedule AND r.started_at < (SELECT at FROM cutoff)
                ORDER BY r.started_at DESC LIMIT 1), 0) AS last_old
        )
        SELECT candidate.id FROM scheduler_jobs j CROSS JOIN LATERAL (
            SELECT r.id FROM scheduler_runs r
            WHERE r.schedule = :schedule AND r.job_id = j.id
                -- NULL while the job has fewer than keep runs: none of them goes.
                AND r.id < (
                    SELECT k.id FROM scheduler_runs k
                    WHERE k.schedule = j.schedule AND k.job_id = j.id
                    ORDER BY k.id DESC OFFSET CAST(:keep AS integer) - 1 LIMIT 1)
                AND r.id <= (SELECT last_old FROM bound)
                AND r.started_at < (SELECT at FROM cutoff)
                AND r.status <> 'running' AND r.running_until IS NULL
                AND r.id IS DISTINCT FROM j.running_run_id
            ORDER BY r.id {limit}
        ) candidate
        WHERE j.schedule = :schedule
        {limit}
        """


# The candidates are read without locks; each is then locked (SKIP LOCKED: a row another
# transaction holds, a run's outcome being written, is left for the next pass) and
# checked again as it is now, so a run that started running meanwhile is never deleted.
_PRUNE_BATCH = text(
    f"""
    DELETE FROM scheduler_runs WHERE id IN (
        SELECT r.id FROM scheduler_runs r
        WHERE r.id IN ({_candidates("LIMIT :batch")})
            AND r.status <> 'running' AND r.running_until IS NULL
        FOR UPDATE SKIP LOCKED)
    """
)

_COUNT = text(f"SELECT count(*) FROM ({_candidates('')}) prunable")


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
