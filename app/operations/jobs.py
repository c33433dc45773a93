"""Jobs as operators read and change them: listed with their state, run now, paused or
resumed, and forgotten once retired.

Shared by the admin API, the admin page and the CLI. Every function takes an engine and
plain values, reads or changes only the rows of the schedule it is given
(app/scheduler/keys.py), and raises AdminError subclasses whose messages name the
problem. An operator's write waits for the leader's claim holding the job's row
(rowlocks.patient_write) and answers Conflict, naming the holder, past that wait.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.scheduler.clock import LEASE_NOW_SQL
from app.scheduler.election import WAKE_CHANNEL
from app.scheduler.keys import DEFAULT_SCHEDULE
from app.scheduler.rowlocks import RowHeldError, held_by_sql, patient_write, row_holder
from app.scheduler.store.leases import leader_run_leased_sql
from app.storable import is_storable_text

from .errors import Conflict, RetiredJobError, UnknownJobError
from .reading import plain_rows

__all__ = ["forget_job", "list_jobs", "require_job", "run_job_now", "set_paused"]

# "running" is a live running lease: a leader run's (store.leases.leader_run_leased_sql)
# or a per-worker run row's, read on the lease clock (LEASE_NOW_SQL: the database
# server's, the clock every lease is written on), never on the reader's. A 'running'
# status without a live lease is read as 'abandoned' (its owner died; the leader reaps
# it at its next tick). A broken job is listed even when it has no row (its first slot
# could not be computed), with ``stored`` false: nothing acts on it (run now, pause,
# its page) until it has one.
# A leader job's due slot or run-now request that no claim has taken yet is
# ``unclaimed_since`` its moment, on the lease clock too; an operator's 'infinity' never
# comes. ``held_by``: the backend whose open transaction locked or is writing such a
# job's row (rowlocks.held_by_sql): the leader's claim leaves a held row out until it
# is free.
_JOBS = text(
    f"""
    WITH replica_running AS (
        SELECT DISTINCT r.job_id FROM scheduler_runs r
        WHERE r.schedule = :schedule AND r.scope = 'replica'
            AND r.running_until > {LEASE_NOW_SQL}
    ), listed AS (
        SELECT j.*, b.job_id AS broken_id, b.error AS broken_error, b.since AS broken_since,
            {leader_run_leased_sql("j")} OR rr.job_id IS NOT NULL AS is_running,
            CASE WHEN j.leader_only AND NOT j.paused AND j.retired_at IS NULL THEN LEAST(
                CASE WHEN isfinite(j.next_run_at) AND j.next_run_at <= {LEASE_NOW_SQL}
                    THEN j.next_run_at END,
                CASE WHEN j.run_requested_at <= {LEASE_NOW_SQL} THEN j.run_requested_at END)
            END AS unclaimed_since,
            j.xmax AS row_xmax
        FROM scheduler_jobs j
        LEFT JOIN scheduler_broken_jobs b ON b.schedule = j.schedule AND b.job_id = j.id
        LEFT JOIN replica_running rr ON rr.job_id = j.id
        WHERE j.schedule = :schedule
    )
    SELECT j.id, j.name, j.trigger, j.leader_only, j.next_run_at, j.last_started_at,
        j.last_finished_at,
        CASE WHEN j.last_status = 'running' AND NOT j.is_running
            THEN 'abandoned' ELSE j.last_status END AS last_status,
        j.last_error, j.last_duration_ms, j.last_success_at,
        j.paused, j.created_at, j.is_running AS running,
        (SELECT r.lateness_ms FROM scheduler_runs r
         WHERE r.schedule = j.schedule AND r.job_id = j.id
         ORDER BY r.id DESC LIMIT 1) AS last_lateness_ms,
        j.broken_id IS NOT NULL AS broken, j.broken_error, j.broken_since, true AS stored,
        j.unclaimed_since,
        extract(epoch FROM {LEASE_NOW_SQL} - j.unclaimed_since)::float AS unclaimed_seconds,
        CASE WHEN j.unclaimed_since IS NOT NULL THEN {held_by_sql("j.row_xmax")} END
            AS held_by,
        j.retired_at
    FROM listed j
    WHERE CAST(:retired AS boolean) OR j.retired_at IS NULL
    UNION ALL
    SELECT b.job_id, b.job_id, NULL, true, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        false, b.since, false, NULL, true, b.error, b.since, false, NULL, NULL, NULL, NULL
    FROM scheduler_broken_jobs b
    WHERE b.schedule = :schedule AND NOT EXISTS (
        SELECT 1 FROM scheduler_jobs j WHERE j.schedule = b.schedule AND j.id = b.job_id)
    ORDER BY id
    """
)
_JOB = text("SELECT 1 FROM scheduler_jobs WHERE schedule = :schedule AND id = :job_id")
# What an operator's write of a job may do (run now, pause, forget), read on the lease clock,
# and the row locked until the write is done: a claim of the job waits for it, so
# "running" cannot change in between.
_JOB_STATE = text(
    f"""
    SELECT leader_only, paused, retired_at IS NOT NULL AS retired,
        {leader_run_leased_sql("j")} AS running
    FROM scheduler_jobs j WHERE schedule = :schedule AND id = :job_id FOR UPDATE
    """
)
# A request beside the schedule (see app/scheduler/store/__init__.py): next_run_at is never
# touched. A request still pending stays: asking twice before the leader takes it is
# one run.
_RUN_NOW = text(
    f"UPDATE scheduler_jobs SET run_requested_at = COALESCE(run_requested_at, {LEASE_NOW_SQL}),"
    " updated_at = now() WHERE schedule = :schedule AND id = :job_id RETURNING run_requested_at"
)
# Pausing drops a pending request: a paused job runs nothing, and a resume does not
# bring back a run asked for before the pause.
_PAUSE = text(
    """
    UPDATE scheduler_jobs
    SET paused = :paused,
        run_requested_at = CASE WHEN :paused THEN NULL ELSE run_requested_at END,
        updated_at = now()
    WHERE schedule = :schedule AND id = :job_id
    """
)
_WAKE = text(f"NOTIFY {WAKE_CHANNEL}")
_JOB_ROW_HOLDER = row_holder("scheduler_jobs", "schedule = :schedule AND id = :job_id")

_FORGET_RUNS = text("DELETE FROM scheduler_runs WHERE schedule = :schedule AND job_id = :job_id")
_FORGET_JOB = text(
    """
    WITH broken AS (
        DELETE FROM scheduler_broken_jobs WHERE schedule = :schedule AND job_id = :job_id
    )
    DELETE FROM scheduler_jobs WHERE schedule = :schedule AND id = :job_id
    """
)


async def list_jobs(
    engine: AsyncEngine,
    lease_now: datetime | None = None,
    *,
    schedule: str = DEFAULT_SCHEDULE,
    retired: bool = False,
) -> list[dict[str, Any]]:
    """Every job of the schedule named ``schedule`` with its schedule state, last
    outcome and whether it is broken; ``retired_at``, when the leader of the schedule
    last promoted found it no longer registered (such a job fires no more and is listed
    only when ``retired``; it is never unclaimed); ``stored`` is false for a broken job that has no
    row yet (no action and no history applies to it). ``running`` (a live running
    lease: the job's, or one of its per-worker runs') and a crashed run's ``abandoned``
    status are read on the lease clock: ``lease_now`` as clock.lease_now gives it, None
    for the database server's clock (the caller's own clock never decides). So are
    ``unclaimed_since`` and ``unclaimed_seconds``: when a leader job's due slot or
    run-now request came, and how long ago, while no claim has taken it (None
    otherwise; a jittered slot is claimed its jitter after it), with ``held_by``, the
    backend pid of a transaction holding its row (None when none does)."""
    async with engine.connect() as conn:
        params = {"lease_now": lease_now, "schedule": schedule, "retired": retired}
        return plain_rows(await conn.execute(_JOBS, params))


@asynccontextmanager
async def _job_write(
    engine: AsyncEngine, job_id: str, schedule: str
) -> AsyncIterator[AsyncConnection]:
    """A transaction that writes a job's row, patient with the leader's claim holding
    it (rowlocks.patient_write); Conflict, naming the holder's backend pid, when the row
    stays held past that, or the write met another on it (a deadlock, a serialization
    failure)."""
    params = {"job_id": job_id, "schedule": schedule}
    try:
        async with patient_write(engine, _JOB_ROW_HOLDER, params) as conn:
            yield conn
    except RowHeldError as exc:
        holder = "" if exc.held_by is None else f" (backend pid {exc.held_by})"
        raise Conflict(
            f"job {job_id!r}: its row stayed held by another transaction{holder} past the "
            "wait, or another write met this one on it (the leader holds it at most "
            "CLAIM_AHEAD_SECONDS while it claims the next slot); try again, or end that "
            "transaction (see pg_stat_activity)"
        ) from None


async def require_job(conn: AsyncConnection, job_id: str, schedule: str) -> None:
    """Raise UnknownJobError unless the schedule has a row for ``job_id``."""
    # A value no text column can hold names no row; asking would be a driver error.
    if not is_storable_text(job_id):
        raise UnknownJobError(job_id, schedule)
    row = (await conn.execute(_JOB, {"job_id": job_id, "schedule": schedule})).first()
    if row is None:
        raise UnknownJobError(job_id, schedule)


@asynccontextmanager
async def _job_state(
    engine: AsyncEngine, job_id: str, schedule: str, lease_now: datetime | None
) -> AsyncIterator[tuple[AsyncConnection, Row[Any]]]:
    """An operator's write of a job (run now, pause, forget), with what it may do (_JOB_STATE,
    its running lease read on the lease clock: ``lease_now``, None for the database
    server's) and the row locked until the write is done. UnknownJobError for an
    unknown job; Conflict as _job_write says."""
    # A value no text column can hold names no row; asking would be a driver error.
    if not is_storable_text(job_id):
        raise UnknownJobError(job_id, schedule)
    async with _job_write(engine, job_id, schedule) as conn:
        params = {"job_id": job_id, "lease_now": lease_now, "schedule": schedule}
        row = (await conn.execute(_JOB_STATE, params)).first()
        if row is None:
            raise UnknownJobError(job_id, schedule)
        yield conn, row


async def run_job_now(
    engine: AsyncEngine,
    job_id: str,
    *,
    lease_now: datetime | None = None,
    schedule: str = DEFAULT_SCHEDULE,
) -> datetime:
    """Ask the leader to run the job once now, beside its schedule: the leader claims
    the request as it claims a slot (the running lease, one run row, marked ``manual``,
    whose slot is the request's time on the lease clock), fires it without jitter, and
    leaves the job's next slot where it was. A request still pending when asked again
    is the same request. Returns the request's time: its run's slot (``manual_run``).

    Raises UnknownJobError (a NotFound) for an unknown job, RetiredJobError (a Conflict)
    for a retired one, and Conflict while it runs
    (its running lease holds, read on the lease clock as in list_jobs: ``lease_now``,
    None for the database server's), while it is paused, and for a per-worker job
    (``leader_only=False``): each worker runs that on its own schedule, and no leader
    takes a request for it. Waits for a claim of the job's next slot that holds its row
    (at most CLAIM_AHEAD_SECONDS); Conflict when the row stays locked much longer.
    """
    async with _job_state(engine, job_id, schedule, lease_now) as (conn, row):
        if not row.leader_only:
            raise Conflict(
                f"job {job_id!r} runs on every worker on its own schedule (leader_only=False), "
                "so it cannot be run now; each worker runs it at its next slot"
            )
        if row.retired:
            raise RetiredJobError(job_id, schedule)
        if row.running:
            raise Conflict(f"job {job_id!r} is running; try again when it has finished")
        if row.paused:
            raise Conflict(f"job {job_id!r} is paused; resume it first")
        params = {"job_id": job_id, "lease_now": lease_now, "schedule": schedule}
        requested: datetime = (await conn.execute(_RUN_NOW, params)).scalar_one()
        await conn.execute(_WAKE)
    return requested


async def forget_job(engine: AsyncEngine, job_id: str, *, schedule: str = DEFAULT_SCHEDULE) -> int:
    """Delete a retired job's row and its whole run history, in one transaction;
    returns how many runs went. Raises UnknownJobError for an unknown job and Conflict
    for a job its schedule's leader still registers (remove it from the code first:
    forgetting a live job would lose the history of a job that runs)."""
    # Read on the database server's clock, as every lease is.
    async with _job_state(engine, job_id, schedule, None) as (conn, row):
        if not row.retired:
            raise Conflict(
                f"job {job_id!r} is registered by the leader of schedule {schedule!r}; "
                "remove it from the code and deploy first (a promotion then retires it)"
            )
        if row.running:
            # A body of an older release may still run it: its outcome needs the run.
            raise Conflict(f"job {job_id!r} is running; forget it when it has finished")
        params = {"job_id": job_id, "schedule": schedule}
        runs = (await conn.execute(_FORGET_RUNS, params)).rowcount
        await conn.execute(_FORGET_JOB, params)
    return runs


async def set_paused(
    engine: AsyncEngine, job_id: str, paused: bool, *, schedule: str = DEFAULT_SCHEDULE
) -> None:
    """Pause or resume a job: the leader claims no slot of a paused job, and every
    worker skips the slots of a paused per-worker job. Pausing drops a pending run-now
    request. Waits for a claim of the job's next slot that holds its row (at most
    CLAIM_AHEAD_SECONDS). Raises UnknownJobError for an unknown job, Conflict when the
    row stays locked much longer, and RetiredJobError for a retired job (nothing acts on
    it: forget it)."""
    # Read on the database server's clock, as every lease is.
    async with _job_state(engine, job_id, schedule, None) as (conn, row):
        if row.retired:
            raise RetiredJobError(job_id, schedule)
        params = {"job_id": job_id, "paused": paused, "schedule": schedule}
        await conn.execute(_PAUSE, params)
        await conn.execute(_WAKE)
