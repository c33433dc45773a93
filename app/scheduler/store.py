"""The scheduler's tables: job rows, slot claims and run history.

The claim is the heart of at-most-once: a conditional UPDATE that moves a job's
``next_run_at`` from the due slot to the next one, committed with the run's history row
before the body runs. Two processes that both think a slot is due race on that
UPDATE, and PostgreSQL lets exactly one of them match the row. A guarded leader adds a
fence to the same statement: the claim matches only while the leader's own lock
connection (by backend pid) still holds the key, so a leader that lost its lock while
paused cannot claim a slot after it wakes.

The claim also reads the leadership term (scheduler_leadership.term, which every
promotion moves while it holds the key) and the run keeps it: the job's own commit is
fenced by it (``JobContext.fence``). A fenced claim sees its own leadership's term,
since a newer term begins only after another process took the key, when the claim's
fence matches nothing.

The same UPDATE takes the job's *running lease* when it starts a run: it allocates the
run's id (``running_run_id``, the lease's token) and sets ``running_since``,
``running_until`` and the owner (``running_pid``, ``running_host``). While a lease is
unexpired, a claim that would start a run records its slot as ``skipped_overlap``
instead, whichever process holds the lease. The owner renews ``running_until`` while
its body runs and clears the lease with the run's outcome; renewing and clearing match
on the run id, so a lease that ran out and was taken by a newer run is left alone.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from .keys import LEADER_KEY_LOCKS
from .registry import JobSpec

__all__ = ["ClaimedSlot", "JobRow", "JobStore", "format_error"]

_UPSERT = text(
    """
    INSERT INTO scheduler_jobs (id, name, trigger, leader_only, next_run_at)
    VALUES (:id, :name, :trigger, :leader_only, :first_slot)
    ON CONFLICT (id) DO UPDATE SET
        name = excluded.name,
        leader_only = excluded.leader_only,
        trigger = excluded.trigger,
        next_run_at = CASE
            WHEN scheduler_jobs.trigger <> excluded.trigger THEN CAST(:reset_slot AS timestamptz)
            ELSE scheduler_jobs.next_run_at
        END,
        updated_at = now()
    RETURNING id, next_run_at, paused
    """
)

_LOAD = text("SELECT id, next_run_at, paused FROM scheduler_jobs WHERE id = ANY(:ids)")

# A run starts only when no other body holds an unexpired running lease on the job.
_STARTS = """(CAST(:runs AS boolean)
        AND (running_until IS NULL OR running_until <= CAST(:now AS timestamptz)))"""
_CLAIM = """
    UPDATE scheduler_jobs
    SET next_run_at = :next_slot,
        last_started_at = CASE WHEN {starts}
            THEN CAST(:now AS timestamptz) ELSE last_started_at END,
        last_status = CASE WHEN {starts} THEN 'running'
            WHEN CAST(:runs AS boolean) THEN 'skipped_overlap' ELSE CAST(:status AS text) END,
        running_run_id = CASE WHEN {starts}
            THEN nextval(pg_get_serial_sequence('scheduler_runs', 'id')) ELSE running_run_id END,
        running_since = CASE WHEN {starts}
            THEN CAST(:now AS timestamptz) ELSE running_since END,
        running_until = CASE WHEN {starts}
            THEN CAST(:running_until AS timestamptz) ELSE running_until END,
        running_pid = CASE WHEN {starts} THEN CAST(:pid AS integer) ELSE running_pid END,
        running_host = CASE WHEN {starts} THEN CAST(:host AS text) ELSE running_host END,
        updated_at = now()
    WHERE id = :job_id AND next_run_at = :due AND NOT paused {fence}
    RETURNING last_status, running_run_id, running_until, running_pid, running_host,
        COALESCE((SELECT term FROM scheduler_leadership WHERE id = 1), 0) AS term
    """
_FENCE = f"""
      AND EXISTS (
        SELECT 1 FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND granted AND pid = :fence_pid)
    """
_CLAIM_UNFENCED = text(_CLAIM.format(starts=_STARTS, fence=""))
_CLAIM_FENCED = text(_CLAIM.format(starts=_STARTS, fence=_FENCE))

_INSERT_RUN = text(
    """
    INSERT INTO scheduler_runs
        (id, job_id, scope, slot, started_at, finished_at, status, lateness_ms, pid, host, error)
    VALUES (COALESCE(CAST(:id AS bigint), nextval(pg_get_serial_sequence('scheduler_runs', 'id'))),
            :job_id, :scope, :slot, :started_at, :finished_at, :status, :lateness_ms,
            :pid, :host, :error)
    RETURNING id
    """
)

_FINISH_RUN = text(
    """
    UPDATE scheduler_runs
    SET finished_at = :finished_at, status = :status, duration_ms = :duration_ms, error = :error
    WHERE id = :run_id
    """
)

_FINISH_JOB = text(
    """
    UPDATE scheduler_jobs
    SET last_finished_at = :finished_at, last_status = :status, last_error = :error,
        last_duration_ms = :duration_ms,
        last_success_at = CASE WHEN CAST(:status AS text) = 'ok'
            THEN CAST(:finished_at AS timestamptz) ELSE last_success_at END,
        updated_at = now()
    WHERE id = :job_id
    """
)
_NEXT_RUN_ID = text("SELECT nextval(pg_get_serial_sequence('scheduler_runs', 'id'))")

_RENEW_LEASE = text(
    """
    UPDATE scheduler_jobs SET running_until = :running_until
    WHERE id = :job_id AND running_run_id = :run_id
    """
)

_RELEASE_LEASE = text(
    """
    UPDATE scheduler_jobs
    SET running_run_id = NULL, running_since = NULL, running_until = NULL,
        running_pid = NULL, running_host = NULL
    WHERE id = :job_id AND running_run_id = :run_id
    """
)

_UPSERT_REPLICA = text(
    """
    INSERT INTO scheduler_jobs (id, name, trigger, leader_only, next_run_at)
    VALUES (:id, :name, :trigger, false, :first_slot)
    ON CONFLICT (id) DO UPDATE SET
        name = excluded.name, trigger = excluded.trigger, leader_only = false,
        updated_at = now()
    """
)


@dataclass(frozen=True)
class ClaimedSlot:
    """A slot claim that matched: its run row, and 'running', 'missed' or
    'skipped_overlap' (a run refused because another body holds the running lease).
    ``term``: the leadership term the claim saw (0 before any leader was recorded)."""

    run_id: int
    status: str
    term: int
    error: str | None = None


@dataclass(frozen=True)
class JobRow:
    """A job's schedule state as the database holds it."""

    next_run_at: datetime
    paused: bool


def format_error(exc: BaseException, limit: int = 8000) -> str:
    """The exception with its traceback, cut to ``limit`` characters for the run row."""
    text_ = "".join(traceback.format_exception(exc))
    return text_[-limit:]


class JobStore:
    """Reads and writes scheduler_jobs and scheduler_runs for one process."""

    def __init__(self, engine: AsyncEngine, *, pid: int, host: str) -> None:
        self.engine = engine
        self.pid = pid
        self.host = host

    async def register_leader_jobs(
        self, specs: Iterable[JobSpec], now: datetime, zone: ZoneInfo
    ) -> dict[str, JobRow]:
        """Upsert the leader's jobs; keep each stored countdown unless its trigger changed.

        ``first_run`` places the first slot of a job whose row does not exist yet (the
        first boot of the deployment): once per job row. A promotion or a restart never
        moves a stored slot, and a changed trigger restarts from its own first slot.
        """
        rows: dict[str, JobRow] = {}
        async with self.engine.begin() as conn:
            for spec in specs:
                own_first_slot = spec.trigger.first_slot(now, zone)
                first_slot = own_first_slot
                if spec.first_run is not None:
                    first_slot = now + timedelta(seconds=spec.first_run)
                result = await conn.execute(
                    _UPSERT,
                    {
                        "id": spec.id,
                        "name": spec.name,
                        "trigger": spec.trigger.describe(),
                        "leader_only": True,
                        "first_slot": first_slot,
                        "reset_slot": own_first_slot,
                    },
                )
                row = result.one()
                rows[row.id] = JobRow(row.next_run_at, row.paused)
        return rows

    async def register_replica_jobs(
        self, specs: Iterable[JobSpec], now: datetime, zone: ZoneInfo
    ) -> None:
        """Make sure every per-replica job has a row, so its runs can be recorded."""
        async with self.engine.begin() as conn:
            for spec in specs:
                await conn.execute(
                    _UPSERT_REPLICA,
                    {
                        "id": spec.id,
                        "name": spec.name,
                        "trigger": spec.trigger.describe(),
                        "first_slot": spec.trigger.first_slot(now, zone),
                    },
                )

    async def load(self, job_ids: Iterable[str]) -> dict[str, JobRow]:
        """The stored next slot and pause flag of each job."""
        async with self.engine.connect() as conn:
            result = await conn.execute(_LOAD, {"ids": list(job_ids)})
            return {row.id: JobRow(row.next_run_at, row.paused) for row in result}

    async def claim(
        self,
        spec: JobSpec,
        *,
        due: datetime,
        next_slot: datetime,
        run_slot: datetime,
        now: datetime,
        status: str,
        fence_pid: int | None,
        running_until: datetime | None = None,
        error: str | None = None,
        missed_before: tuple[datetime, str] | None = None,
    ) -> ClaimedSlot | None:
        """Claim slot ``due`` and record its run row, in one commit.

        ``status`` is 'running' for a run, or 'missed' / 'skipped_overlap' for a slot
        that is claimed but not run. A run takes the job's running lease until
        ``running_until`` in the claim's own UPDATE; while another body holds an
        unexpired lease the slot is recorded 'skipped_overlap' instead. ``missed_before``
        (slot, note) adds a 'missed' row for the slots an outage passed over before this
        one. Returns the run row and the status it got, or None when the claim matched
        nothing: another process took the slot, the job is paused, or (fenced) this
        process no longer holds the leader key.
        """
        runs = status == "running"
        assert not runs or running_until is not None, "a run needs the end of its lease"
        params = {
            "job_id": spec.id,
            "due": due,
            "next_slot": next_slot,
            "now": now,
            "runs": runs,
            "status": status,
            "running_until": running_until,
            "pid": self.pid,
            "host": self.host,
        }
        statement = _CLAIM_UNFENCED
        if fence_pid is not None:
            statement = _CLAIM_FENCED
            params |= {"fence_pid": fence_pid}
        async with self.engine.begin() as conn:
            # History reads in id order: the passed-over slots' row gets the lower id,
            # though the claim below allocates the run's id (its lease token) first.
            missed_id = None
            if missed_before is not None:
                missed_id = (await conn.execute(_NEXT_RUN_ID)).scalar_one()
            claimed = (await conn.execute(statement, params)).one_or_none()
            if claimed is None:
                return None
            run_id: int | None = None
            if runs and claimed.last_status == "running":
                run_id = claimed.running_run_id
            elif runs:
                status = "skipped_overlap"
                error = (
                    f"run {claimed.running_run_id} was still going on "
                    f"{claimed.running_host} (pid {claimed.running_pid}); its running lease "
                    f"lasts until {claimed.running_until.isoformat()}"
                )
            if missed_before is not None:
                missed_slot, note = missed_before
                await conn.execute(
                    _INSERT_RUN,
                    self._run_params(
                        spec, "leader", missed_slot, now, "missed", error=note, id=missed_id
                    ),
                )
            result = await conn.execute(
                _INSERT_RUN,
                self._run_params(spec, "leader", run_slot, now, status, error=error, id=run_id),
            )
            return ClaimedSlot(result.scalar_one(), status, claimed.term, error)

    async def renew_lease(self, job_id: str, run_id: int, running_until: datetime) -> bool:
        """Move the running lease of run ``run_id`` to ``running_until``; False when the
        run no longer holds it (it ran out and another run took the job)."""
        async with self.engine.begin() as conn:
            params = {"job_id": job_id, "run_id": run_id, "running_until": running_until}
            return (await conn.execute(_RENEW_LEASE, params)).rowcount == 1

    async def release_lease(self, job_id: str, run_id: int) -> None:
        """Clear the running lease of run ``run_id``, if it still holds it."""
        async with self.engine.begin() as conn:
            await conn.execute(_RELEASE_LEASE, {"job_id": job_id, "run_id": run_id})

    async def start_replica_run(self, spec: JobSpec, slot: datetime, now: datetime) -> int:
        """Record the start of a per-replica run (no claim: every worker runs it)."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                _INSERT_RUN, self._run_params(spec, "replica", slot, now, "running")
            )
            run_id: int = result.scalar_one()
            return run_id

    async def finish(
        self,
        run_id: int,
        job_id: str,
        *,
        status: str,
        finished_at: datetime,
        duration_ms: int,
        error: str | None,
        body_ended: bool = True,
    ) -> None:
        """Record a run's outcome on its run row and on the job row, and clear its
        running lease unless ``body_ended`` is False (a thread still running)."""
        params = {
            "run_id": run_id,
            "job_id": job_id,
            "status": status,
            "finished_at": finished_at,
            "duration_ms": duration_ms,
            "error": error,
        }
        async with self.engine.begin() as conn:
            await conn.execute(_FINISH_RUN, params)
            await conn.execute(_FINISH_JOB, params)
            if body_ended:
                await conn.execute(_RELEASE_LEASE, params)

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
    ) -> dict[str, object]:
        finished = None if status == "running" else now
        return {
            "id": id,
            "job_id": spec.id,
            "scope": scope,
            "slot": slot,
            "started_at": now,
            "finished_at": finished,
            "status": status,
            "lateness_ms": max(0, int((now - slot).total_seconds() * 1000)),
            "pid": self.pid,
            "host": self.host,
            "error": error,
        }
