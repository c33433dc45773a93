"""The scheduler's tables: job rows, slot claims and run history.

The claim is the heart of at-most-once: a conditional UPDATE that moves a job's
``next_run_at`` from the due slot to the next one, committed with the run's history row
before the body runs. Two processes that both think a slot is due race on that
UPDATE, and PostgreSQL lets exactly one of them match the row. A guarded leader adds a
fence to the same statement: the claim matches only while the leader's own lock
connection (by backend pid) still holds the key, so a leader that lost its lock while
paused cannot claim a slot after it wakes.
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

__all__ = ["JobRow", "JobStore", "format_error"]

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

_CLAIM = """
    UPDATE scheduler_jobs
    SET next_run_at = :next_slot,
        last_started_at = CASE WHEN CAST(:runs AS boolean)
            THEN CAST(:now AS timestamptz) ELSE last_started_at END,
        last_status = CASE WHEN CAST(:runs AS boolean)
            THEN 'running' ELSE CAST(:status AS text) END,
        updated_at = now()
    WHERE id = :job_id AND next_run_at = :due AND NOT paused {fence}
    """
_FENCE = f"""
      AND EXISTS (
        SELECT 1 FROM pg_locks WHERE {LEADER_KEY_LOCKS} AND granted AND pid = :fence_pid)
    """
_CLAIM_UNFENCED = text(_CLAIM.format(fence=""))
_CLAIM_FENCED = text(_CLAIM.format(fence=_FENCE))

_INSERT_RUN = text(
    """
    INSERT INTO scheduler_runs
        (job_id, scope, slot, started_at, finished_at, status, lateness_ms, pid, host, error)
    VALUES (:job_id, :scope, :slot, :started_at, :finished_at, :status, :lateness_ms,
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

_UPSERT_REPLICA = text(
    """
    INSERT INTO scheduler_jobs (id, name, trigger, leader_only, next_run_at)
    VALUES (:id, :name, :trigger, false, :first_slot)
    ON CONFLICT (id) DO UPDATE SET
        name = excluded.name, trigger = excluded.trigger, leader_only = false,
        updated_at = now()
    """
)


_RECORD_LEADERSHIP = text(
    """
    INSERT INTO scheduler_leadership (id, pid, host, backend_pid, since)
    VALUES (1, :pid, :host, :backend_pid, :since)
    ON CONFLICT (id) DO UPDATE SET pid = excluded.pid, host = excluded.host,
        backend_pid = excluded.backend_pid, since = excluded.since
    """
)


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

    async def record_leadership(self, backend_pid: int, since: datetime) -> None:
        """Note who leads and since when, for operators (the lock stays the truth)."""
        async with self.engine.begin() as conn:
            await conn.execute(
                _RECORD_LEADERSHIP,
                {"pid": self.pid, "host": self.host, "backend_pid": backend_pid, "since": since},
            )

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
        error: str | None = None,
        missed_before: tuple[datetime, str] | None = None,
    ) -> int | None:
        """Claim slot ``due`` and record its run row, in one commit.

        ``status`` is 'running' for a run, or 'missed' / 'skipped_overlap' for a slot
        that is claimed but not run. ``missed_before`` (slot, note) adds a 'missed' row
        for the slots an outage passed over before this one. Returns the run id, or None
        when the claim matched nothing: another process took the slot, the job is
        paused, or (fenced) this process no longer holds the leader key.
        """
        runs = status == "running"
        params = {
            "job_id": spec.id,
            "due": due,
            "next_slot": next_slot,
            "now": now,
            "runs": runs,
            "status": status,
        }
        statement = _CLAIM_UNFENCED
        if fence_pid is not None:
            statement = _CLAIM_FENCED
            params |= {"fence_pid": fence_pid}
        async with self.engine.begin() as conn:
            if (await conn.execute(statement, params)).rowcount != 1:
                return None
            if missed_before is not None:
                missed_slot, note = missed_before
                await conn.execute(
                    _INSERT_RUN,
                    self._run_params(spec, "leader", missed_slot, now, "missed", error=note),
                )
            result = await conn.execute(
                _INSERT_RUN,
                self._run_params(spec, "leader", run_slot, now, status, error=error),
            )
            run_id: int = result.scalar_one()
            return run_id

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
    ) -> None:
        """Record a run's outcome on its run row and on the job row."""
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

    def _run_params(
        self,
        spec: JobSpec,
        scope: str,
        slot: datetime,
        now: datetime,
        status: str,
        *,
        error: str | None = None,
    ) -> dict[str, object]:
        finished = None if status == "running" else now
        return {
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
