"""Runs' outcomes: the one writer of how a run ended, on its run row and its job row,
with the release of its running lease; for the event loop's batches and a thread's
write alike (the same statements, finish_steps); and a per-worker run's start."""

from __future__ import annotations

import traceback
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text

from app.storable import escape_unstorable

from ..clock import LEASE_END_SQL as _LEASE_END
from ..clock import LEASE_NOW_SQL
from ..registry import JobSpec
from ..rowlocks import ROW_LOCK_PATIENCE
from .base import (
    Steps,
    StoreBase,
    flag,
    iso,
    lateness_ms,
    lease_reading,
    run_steps,
)
from .reap import ReapedRun, reap_replica_runs

__all__ = ["Outcome", "RunStore", "finish_steps", "format_error"]

_INSERT_RUN = text(
    f"""
    INSERT INTO scheduler_runs
        (id, schedule, job_id, scope, slot, manual, started_at, finished_at, status,
         lateness_ms, jitter_ms, pid, host, error, running_until)
    VALUES (COALESCE(CAST(:id AS bigint), nextval(pg_get_serial_sequence('scheduler_runs', 'id'))),
            :schedule, :job_id, :scope, :slot, :manual, :started_at, :finished_at, :status,
            :lateness_ms, :jitter_ms, :pid, :host, :error,
            CASE WHEN CAST(:lease_seconds AS double precision) IS NOT NULL THEN {_LEASE_END} END)
    ON CONFLICT (schedule, job_id, slot, manual) WHERE scope = 'leader' DO NOTHING
    RETURNING id
    """
)

# The outcomes of a batch of runs, one row (o) per run: arrays travel as text[] (see
# _UPSERT). A batch holds one outcome per job: a job row takes one per statement.
_OUTCOMES = """unnest(CAST(CAST(:run_ids AS text[]) AS bigint[]), CAST(:job_ids AS text[]),
            CAST(:statuses AS text[]), CAST(CAST(:finished_ats AS text[]) AS timestamptz[]),
            CAST(CAST(:durations_ms AS text[]) AS bigint[]), CAST(:errors AS text[]),
            CAST(CAST(:bodies_ended AS text[]) AS boolean[]))
        AS o(run_id, job_id, status, finished_at, duration_ms, error, body_ended)"""

# The run rows of a batch of outcomes, locked, as they were before the outcomes landed.
_BEFORE = """(SELECT id, status FROM scheduler_runs
        WHERE id = ANY(CAST(CAST(:run_ids AS text[]) AS bigint[])) FOR UPDATE) before"""

# A per-worker run's own lease is cleared with its outcome, unless its body runs on
# (a thread past its timeout): the lease then lasts until the body ends. The outcome of
# a run reaped meanwhile still lands: it is the truth, and 'abandoned' was a guess.
# It returns the status each run had (``was``: 'abandoned' once reaped) and its scope,
# for the job rows' write (_FINISH_JOBS).
_FINISH_RUNS = text(
    f"""
    UPDATE scheduler_runs r
    SET finished_at = o.finished_at, status = o.status, duration_ms = o.duration_ms,
        error = o.error,
        running_until = CASE WHEN o.body_ended THEN NULL ELSE r.running_until END
    FROM {_OUTCOMES}, {_BEFORE}
    WHERE r.id = o.run_id AND before.id = o.run_id
    RETURNING o.run_id, before.status AS was, r.scope
    """
)

# The job row takes a run's outcome unless a newer run holds the job's lease, or
# another worker's run of a per-worker job still holds its own: a late outcome of a
# reaped run is then recorded on its run row only, and a per-worker job reads
# 'running' until its last live run ends. A run that lost its lease (reaped: it read
# 'abandoned' when its outcome came, ``b.was``; or a leader run the job's lease no
# longer names) settles the job only while no newer run of the job has started, even
# one that has finished since: the row shows the newest run's outcome. Run ids are
# allocated in start order, so "newer" compares ids, never two hosts' clocks; a slot
# recorded as missed or skipped_overlap is not a run. A run row no longer stored (b
# missing) lands as it always did.
_FINISH_JOBS = text(
    f"""
    UPDATE scheduler_jobs j
    SET last_finished_at = o.finished_at, last_status = o.status, last_error = o.error,
        last_duration_ms = o.duration_ms,
        last_success_at = CASE WHEN o.status = 'ok' THEN o.finished_at ELSE j.last_success_at END,
        updated_at = now()
    FROM {_OUTCOMES}
        LEFT JOIN unnest(CAST(CAST(:before_ids AS text[]) AS bigint[]),
            CAST(:wases AS text[]), CAST(:scopes AS text[])) AS b(run_id, was, scope)
        ON b.run_id = o.run_id
    WHERE j.schedule = :schedule AND j.id = o.job_id
        AND (j.running_run_id IS NULL OR j.running_run_id = o.run_id)
        AND NOT EXISTS (
            SELECT 1 FROM scheduler_runs other
            WHERE other.schedule = :schedule AND other.job_id = o.job_id
                AND other.scope = 'replica' AND other.id <> o.run_id
                AND other.running_until > {LEASE_NOW_SQL})
        AND NOT (
            (COALESCE(b.was = 'abandoned', false)
                OR (COALESCE(b.scope = 'leader', false) AND j.running_run_id IS NULL))
            AND EXISTS (
                SELECT 1 FROM scheduler_runs newer
                WHERE newer.schedule = :schedule AND newer.job_id = o.job_id
                    AND newer.id > o.run_id
                    AND newer.status NOT IN ('missed', 'skipped_overlap')))
    """
)
# A per-worker start shows on the job row as a leader run's claim does; its outcome
# settles it (_FINISH_JOBS), and a reap of it turns it 'abandoned'. An error is an
# outcome's: a run in progress shows none (not the note of the reap its start made).
_START_REPLICA_JOB = text(
    """
    UPDATE scheduler_jobs
    SET last_started_at = :started_at, last_status = 'running', last_error = NULL,
        updated_at = now()
    WHERE schedule = :schedule AND id = :job_id
    """
)

# The leases of the runs whose bodies ended (o.body_ended).
_RELEASE_LEASES = text(
    f"""
    UPDATE scheduler_jobs j
    SET running_run_id = NULL, running_since = NULL, running_until = NULL,
        running_pid = NULL, running_host = NULL
    FROM {_OUTCOMES}
    WHERE o.body_ended AND j.schedule = :schedule AND j.id = o.job_id
        AND j.running_run_id = o.run_id
    """
)
_RELEASE_REPLICA_LEASES = text(
    f"""
    UPDATE scheduler_runs r SET running_until = NULL
    FROM {_OUTCOMES}
    WHERE o.body_ended AND r.id = o.run_id
    """
)
# The outcome of a run whose body ended after it was recorded (a thread past its
# timeout), written again only where that record did not land: the run still reads
# 'running', or a reap guessed 'abandoned' meanwhile. A run never stays 'running'
# once its lease is released.
_SETTLE_RUNS = text(
    f"""
    UPDATE scheduler_runs r
    SET finished_at = o.finished_at, status = o.status, duration_ms = o.duration_ms,
        error = o.error, running_until = NULL
    FROM {_OUTCOMES}, {_BEFORE}
    WHERE r.id = o.run_id AND before.id = o.run_id
        AND before.status IN ('running', 'abandoned')
    RETURNING o.run_id, before.status AS was, r.scope
    """
)


@dataclass(frozen=True)
class Outcome:
    """How one run ended, for its run row and its job row. ``body_ended`` False: a
    thread past its timeout runs on, and the run keeps its running lease."""

    run_id: int
    job_id: str
    status: str
    finished_at: datetime
    duration_ms: int
    error: str | None
    body_ended: bool = True


def format_error(exc: BaseException, limit: int = 8000) -> str:
    """The exception with its traceback, cut to ``limit`` characters for the run row,
    and always storable: a NUL or a lone surrogate (text a body quoted from raw bytes)
    is escaped, since PostgreSQL refuses it and the whole outcome would be lost."""
    return escape_unstorable(("".join(traceback.format_exception(exc)))[-limit:])


class RunStore(StoreBase):
    """The starts and outcomes of runs (part of JobStore)."""

    async def release_lease(self, outcome: Outcome, *, replica: bool = False) -> None:
        """Clear the running lease of ``outcome``'s run (``replica``: its run row's own),
        if it still holds it, as the body whose outcome was recorded before it ended (a
        thread past its timeout) ends. That outcome is recorded again, as finish_many()
        does, where its first record did not land, so the run is never left 'running'
        without a lease."""
        params = _outcome_arrays(self.schedule, [outcome], lease_reading(self.lease_clock))
        async with self.engine.begin() as conn:
            settled = list(await conn.execute(_SETTLE_RUNS, params))
            if settled:
                await conn.execute(_FINISH_JOBS, params | _runs_before(settled))
            await conn.execute(_RELEASE_REPLICA_LEASES if replica else _RELEASE_LEASES, params)

    async def start_replica_run(
        self,
        spec: JobSpec,
        slot: datetime,
        now: datetime,
        *,
        lease_seconds: float,
        jitter: float = 0.0,
        renewing: Collection[int] = (),
    ) -> tuple[int, list[ReapedRun]]:
        """Record the start of a per-replica run (no claim: every worker runs it), with
        its own running lease for ``lease_seconds``; lateness counts from ``slot`` +
        ``jitter`` seconds. The job's runs whose lease ran out are reaped
        first (never the runs ``renewing``, which this process renews itself), so they
        are reaped while any worker runs the job, leader or not. Returns the new run's
        id and the runs reaped."""
        async with self.engine.begin() as conn:
            reaped = await reap_replica_runs(self, conn, now, renewing, spec.id)
            params = self._run_params(spec, "replica", slot, now, "running", jitter=jitter)
            result = await conn.execute(_INSERT_RUN, params | {"lease_seconds": lease_seconds})
            run_id: int = result.scalar_one()
            await conn.execute(
                _START_REPLICA_JOB,
                {"started_at": now, "job_id": spec.id, "schedule": self.schedule},
            )
            return run_id, reaped

    async def finish_many(self, outcomes: Sequence[Outcome]) -> None:
        """Record every outcome on its run row and on its job row, and clear the running
        lease of each run whose body ended, in one commit of three statements however
        many there are. At most one outcome per job (a job row takes one per
        statement). Raises what the database raises, after at most a second's wait for
        a row another transaction holds; nothing is recorded then."""
        if not outcomes:
            return
        steps = finish_steps(self.schedule, outcomes, lease_reading(self.lease_clock))
        async with self.engine.begin() as conn:
            await conn.execute(ROW_LOCK_PATIENCE)
            await run_steps(conn, steps)

    def _run_params(
        self,
        spec: JobSpec,
        scope: str,
        slot: datetime,
        now: datetime,
        status: str,
        *,
        error: str | None = None,
        id: int | None = None,
        jitter: float = 0.0,
        manual: bool = False,
    ) -> dict[str, object]:
        finished = None if status == "running" else now
        return {
            "id": id,
            "schedule": self.schedule,
            "job_id": spec.id,
            "scope": scope,
            "slot": slot,
            "manual": manual,
            "started_at": now,
            "finished_at": finished,
            "status": status,
            "lateness_ms": lateness_ms(now, slot, jitter),
            "jitter_ms": int(jitter * 1000),
            "pid": self.pid,
            "host": self.host,
            "error": error,
            "lease_seconds": None,
        } | self.lease_params(now)


def finish_steps(
    schedule: str, outcomes: Sequence[Outcome], lease_now: datetime | None
) -> Steps[None]:
    """The one write of how runs ended, for the loop's batches (RunStore.finish_many)
    and a thread's outcome (ThreadStore.finish): each outcome on its run row and on its
    job row, and the running lease of each run whose body ended cleared, in three
    statements however many there are. At most one outcome per job (a job row takes
    one per statement). ``lease_now``: the lease clock's reading (None: the server's)."""
    assert len({outcome.job_id for outcome in outcomes}) == len(outcomes), (
        "one outcome per job in a batch"
    )
    # Job rows in id order, as claims lock them: a batch never deadlocks with one.
    outcomes = sorted(outcomes, key=lambda outcome: outcome.job_id)
    params = _outcome_arrays(schedule, outcomes, lease_now)
    before = yield _FINISH_RUNS, params
    yield _FINISH_JOBS, params | _runs_before(before)
    if any(outcome.body_ended for outcome in outcomes):
        yield _RELEASE_LEASES, params


def _runs_before(rows: Sequence[Any]) -> dict[str, object]:
    # What _FINISH_JOBS reads of each run as its outcome came: its status then, its scope.
    return {
        "before_ids": [str(row.run_id) for row in rows],
        "wases": [row.was for row in rows],
        "scopes": [row.scope for row in rows],
    }


def _outcome_arrays(
    schedule: str, outcomes: Sequence[Outcome], lease_now: datetime | None
) -> dict[str, object]:
    return {
        "lease_now": lease_now,
        "schedule": schedule,
        "run_ids": [str(outcome.run_id) for outcome in outcomes],
        "job_ids": [outcome.job_id for outcome in outcomes],
        "statuses": [outcome.status for outcome in outcomes],
        "finished_ats": [iso(outcome.finished_at) for outcome in outcomes],
        "durations_ms": [str(outcome.duration_ms) for outcome in outcomes],
        "errors": [outcome.error for outcome in outcomes],
        "bodies_ended": [flag(outcome.body_ended) for outcome in outcomes],
    }
