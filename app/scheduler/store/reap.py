"""The one reaper: running leases that ran out (their owner died or froze past them)
turn their runs, and the job's running status, 'abandoned'. The leader's tick reaps the
whole schedule (reap), a claim the jobs it starts (lock_and_reap), a per-worker start
its job's runs (reap_replica_runs): the same statements."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..clock import LEASE_NOW_SQL
from .base import StoreBase
from .busy import FREE_ROWS, HELD_ROWS

__all__ = [
    "JobsReaped",
    "ReapStore",
    "ReapedRun",
    "lock_and_reap",
    "reap_jobs",
    "reap_replica_runs",
]

# The runs whose lease the reaping process renews itself (its LeaseKeeper's), as text[]
# (see _UPSERT): their bodies run in that process, so a lease of theirs that ran out
# only says the process froze past it, and its renewal is on its way.
_RENEWING = "CAST(CAST(:renewing AS text[]) AS bigint[])"

# A lease that ran out: its owner died (or froze past it). A leader run's lease is
# held on its run row (``scheduler_runs.running_until``, renewed there) and named on
# its job row (``running_run_id``; the job row's ``running_until`` is a copy, renewed
# only while no other transaction holds that row, so never later than the run row's):
# it ran out when both say so (a run row without one is a run of a release before
# run-row leases). Its run, if still recorded as running, and the job's running status
# become 'abandoned'; both leases are cleared, so the owner's next renewal finds it
# lost. Never a lease the reaping process renews itself. A row held elsewhere, the
# job's or its run's (an operator's open transaction, or the owner's renewal under
# way), is skipped, never waited on (the busy-row rule of busy.lock_free_rows): the
# reap runs inside the claim and the tick, and a wait there would hold up every job.
# The run row's lease is read again as it is locked (a renewal may have committed since
# the statement began). A job whose run row is held or renewed meanwhile keeps its
# lease; it is returned ``held`` so that a claim leaves it out as busy, rather than
# start a run beside a body that may still renew.
_REAP = text(
    f"""
    WITH lapsed AS (
        SELECT j.id, j.running_run_id,
            format('abandoned: the process that ran it (pid %s on %s) stopped renewing its '
                   'running lease, which ran out at %s', j.running_pid, j.running_host,
                   GREATEST(j.running_until, r.running_until)) AS note
        FROM scheduler_jobs j
        LEFT JOIN scheduler_runs r ON r.id = j.running_run_id
        WHERE j.schedule = :schedule AND j.running_until <= {LEASE_NOW_SQL}
            AND (r.running_until IS NULL OR r.running_until <= {LEASE_NOW_SQL})
            AND (CAST(:job_ids AS text[]) IS NULL OR j.id = ANY(CAST(:job_ids AS text[])))
            AND j.running_run_id <> ALL({_RENEWING})
        FOR UPDATE OF j SKIP LOCKED
    ), free_runs AS (
        SELECT id FROM scheduler_runs
        WHERE id IN (SELECT running_run_id FROM lapsed)
            AND (status = 'running' OR running_until IS NOT NULL)
            AND (running_until IS NULL OR running_until <= {LEASE_NOW_SQL})
        FOR NO KEY UPDATE SKIP LOCKED
    ), expired AS (
        SELECT * FROM lapsed l
        WHERE l.running_run_id IN (SELECT id FROM free_runs) OR NOT EXISTS (
            SELECT 1 FROM scheduler_runs r WHERE r.id = l.running_run_id
                AND (r.status = 'running' OR r.running_until IS NOT NULL))
    ), abandoned_runs AS (
        UPDATE scheduler_runs r
        SET status = CASE WHEN r.status = 'running' THEN 'abandoned' ELSE r.status END,
            finished_at = CASE WHEN r.status = 'running'
                THEN CAST(:now AS timestamptz) ELSE r.finished_at END,
            error = CASE WHEN r.status = 'running' THEN e.note ELSE r.error END,
            running_until = NULL
        FROM expired e
        WHERE r.id = e.running_run_id AND r.id IN (SELECT id FROM free_runs)
    ), reaped AS (
        UPDATE scheduler_jobs j
        SET last_status = CASE WHEN j.last_status = 'running'
                THEN 'abandoned' ELSE j.last_status END,
            last_finished_at = CASE WHEN j.last_status = 'running'
                THEN CAST(:now AS timestamptz) ELSE j.last_finished_at END,
            last_error = CASE WHEN j.last_status = 'running' THEN e.note ELSE j.last_error END,
            running_run_id = NULL, running_since = NULL, running_until = NULL,
            running_pid = NULL, running_host = NULL, updated_at = now()
        FROM expired e
        WHERE j.schedule = :schedule AND j.id = e.id
        RETURNING j.id
    )
    SELECT id, false AS held FROM reaped
    UNION ALL SELECT id, true FROM lapsed WHERE id NOT IN (SELECT id FROM expired)
    """
)

# A claim's first statement: its jobs' free rows locked (busy.FREE_ROWS), those held
# elsewhere named 'busy', and those of its runs whose job row's lease ran out named
# 'lapsed'. Only these can be reaped (_REAP asks the job row's lease first, and a row
# locked here changes in no other transaction before the claim commits), so a claim
# with none, the common case, skips _REAP: the costliest statement of a claim to plan.
_LOCK_AND_FIND_LAPSED = text(
    f"""
    WITH {FREE_ROWS}
    SELECT id, 'busy' AS outcome FROM ({HELD_ROWS}) held
    UNION ALL SELECT id, 'lapsed' FROM free
    WHERE id = ANY(CAST(:job_ids AS text[])) AND running_until <= {LEASE_NOW_SQL}
    """
)

# The per-worker runs whose own lease ran out: their worker died (or froze past it).
# A run still recorded as running becomes 'abandoned', and so does the job's last
# status while it still says 'running' (no outcome was recorded since the last start,
# and no leader run of it holds the job's lease); every expired lease is cleared.
# Statuses decide, never times: a finish is stamped on its worker's own clock, which
# cannot be compared with a lease's end on the lease clock. A job whose row another
# transaction holds is passed by, its runs with it (reaped by a later reap), and so is
# a run row held elsewhere: skipped, never waited on (job rows first, as claims lock
# them), for the reap runs in the tick and in every per-worker start.
_REAP_REPLICA_RUNS = text(
    f"""
    WITH lapsed AS (
        SELECT id, job_id FROM scheduler_runs
        WHERE schedule = :schedule AND running_until <= {LEASE_NOW_SQL} AND scope = 'replica'
            AND (CAST(:job_id AS text) IS NULL OR job_id = CAST(:job_id AS text))
            AND id <> ALL({_RENEWING})
    ), free_jobs AS (
        SELECT id FROM scheduler_jobs
        WHERE schedule = :schedule AND id IN (SELECT job_id FROM lapsed)
        ORDER BY id
        FOR NO KEY UPDATE SKIP LOCKED
    ), expired AS (
        SELECT id, job_id, status AS was, running_until AS lapsed_at,
            format('abandoned: the worker that ran it (pid %s on %s) stopped renewing its '
                   'running lease, which ran out at %s', pid, host, running_until) AS note
        FROM scheduler_runs
        WHERE id IN (SELECT id FROM lapsed) AND job_id IN (SELECT id FROM free_jobs)
            AND running_until <= {LEASE_NOW_SQL}
        FOR UPDATE SKIP LOCKED
    ), reaped AS (
        UPDATE scheduler_runs r
        SET status = CASE WHEN e.was = 'running' THEN 'abandoned' ELSE r.status END,
            finished_at = CASE WHEN e.was = 'running'
                THEN CAST(:now AS timestamptz) ELSE r.finished_at END,
            error = CASE WHEN e.was = 'running' THEN e.note ELSE r.error END,
            running_until = NULL
        FROM expired e
        WHERE r.id = e.id
        RETURNING r.id, r.job_id, r.pid, r.host, e.was, e.lapsed_at, e.note
    ), latest AS (
        SELECT DISTINCT ON (job_id) job_id, lapsed_at, note FROM reaped WHERE was = 'running'
        ORDER BY job_id, lapsed_at DESC
    ), jobs AS (
        UPDATE scheduler_jobs j
        SET last_status = 'abandoned', last_finished_at = CAST(:now AS timestamptz),
            last_error = l.note, updated_at = now()
        FROM latest l
        WHERE j.schedule = :schedule AND j.id = l.job_id
            AND j.last_status = 'running'
            AND NOT coalesce(j.running_until > {LEASE_NOW_SQL}, false)
            AND NOT EXISTS (
                SELECT 1 FROM scheduler_runs other
                WHERE other.schedule = :schedule AND other.job_id = j.id
                    AND other.scope = 'replica' AND other.running_until > {LEASE_NOW_SQL})
    )
    SELECT id AS run_id, job_id, pid, host FROM reaped WHERE was = 'running' ORDER BY id
    """
)


@dataclass(frozen=True)
class JobsReaped:
    """What a reap of job rows did: the jobs it ``reaped``, and those whose lease ran
    out but whose run row another transaction holds (``held``): they keep their lease
    until a later reap, and a claim leaves them out as busy."""

    reaped: list[str]
    held: list[str]


@dataclass(frozen=True)
class ReapedRun:
    """A per-worker run reaped to 'abandoned': its worker (``pid`` on ``host``)
    stopped renewing its running lease."""

    job_id: str
    run_id: int
    pid: int
    host: str


def reap_params(
    store: StoreBase,
    now: datetime,
    renewing: Collection[int],
    job_id: str | None = None,
    job_ids: list[str] | None = None,
) -> dict[str, object]:
    """The parameters of a reap as of ``now``: never the runs of ``renewing``."""
    return {
        "now": now,
        "job_id": job_id,
        "job_ids": job_ids,
        "schedule": store.schedule,
        "renewing": [str(run_id) for run_id in sorted(renewing)],
    } | store.lease_params(now)


async def reap_jobs(
    store: StoreBase,
    conn: AsyncConnection,
    now: datetime,
    renewing: Collection[int],
    job_ids: list[str] | None = None,
    lease_now: dict[str, object] | None = None,
) -> JobsReaped:
    """Reap the lapsed running leases on the job rows of ``job_ids`` (None: every job
    of the schedule), in ``conn``'s transaction, but never those of the runs
    ``renewing`` (this process renews them: their bodies run here), nor a job whose row
    or run row another transaction holds (skipped, never waited on); return the jobs
    reaped and those passed by because their run row is held. ``lease_now``: the lease
    clock's reading to reap as of (a prepared claim's)."""
    params = reap_params(store, now, renewing, job_ids=job_ids) | (lease_now or {})
    rows = (await conn.execute(_REAP, params)).all()
    return JobsReaped(
        reaped=[row.id for row in rows if not row.held],
        held=[row.id for row in rows if row.held],
    )


async def lock_and_reap(
    store: StoreBase,
    conn: AsyncConnection,
    ids: list[str],
    runs: list[str],
    now: datetime,
    renewing: Collection[int],
    lease_now: dict[str, object],
) -> tuple[list[str], JobsReaped]:
    """A claim's reap: lock the rows of ``ids`` that no other transaction holds
    (busy.FREE_ROWS: never waited on), then reap as reap_jobs does the lapsed leases of
    those of ``runs`` it locked, in ``conn``'s transaction, never those of the runs
    ``renewing``; return the jobs whose row another transaction holds, and what the
    reap did. A claim none of whose locked rows shows a lease that ran out pays one
    statement, not two."""
    params = reap_params(store, now, renewing, job_ids=runs) | lease_now | {"ids": ids}
    rows = (await conn.execute(_LOCK_AND_FIND_LAPSED, params)).all()
    held = [row.id for row in rows if row.outcome == "busy"]
    lapsed = [row.id for row in rows if row.outcome == "lapsed"]
    if not lapsed:
        return held, JobsReaped(reaped=[], held=[])
    return held, await reap_jobs(store, conn, now, renewing, lapsed, lease_now)


async def reap_replica_runs(
    store: StoreBase,
    conn: AsyncConnection,
    now: datetime,
    renewing: Collection[int],
    job_id: str | None = None,
) -> list[ReapedRun]:
    """Reap the per-worker runs of ``job_id`` (None: of every job) whose own running
    lease ran out, in ``conn``'s transaction, but never the runs ``renewing``; return
    them."""
    params = reap_params(store, now, renewing, job_id)
    return [
        ReapedRun(row.job_id, row.run_id, row.pid, row.host)
        for row in await conn.execute(_REAP_REPLICA_RUNS, params)
    ]


class ReapStore(StoreBase):
    """The leader tick's reap (part of JobStore)."""

    async def reap(self, now: datetime, renewing: Collection[int] = ()) -> list[str]:
        """Reap every running lease that ran out (on the lease clock), a leader run's on the job
        row and a per-worker run's on its run row (see the module docstring); return the
        ids of the jobs reaped, once per run. The leases of the runs ``renewing`` (those
        this process renews itself, LeaseKeeper.renewing) are never reaped: their
        bodies run here."""
        async with self.engine.begin() as conn:
            reaped = (await reap_jobs(self, conn, now, renewing)).reaped
            replicas = await reap_replica_runs(self, conn, now, renewing)
            return reaped + [run.job_id for run in replicas]
