"""Writing job rows at registration: a leader's jobs in one statement, a per-worker
job's row and its shown slot, and the marks of jobs the leader cannot handle."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..errors import JobRowBusyError
from ..registry import JobSpec
from ..triggers import Trigger
from .base import StoreBase, iso
from .busy import lock_free_rows
from .rows import JobRow

__all__ = ["LeaderRow", "RegistrationStore"]

# Every leader job's row in one statement: a promotion with 10,000 jobs is one round trip,
# not 10,000. A row given without slots (stored with the same trigger) only has its name
# refreshed; one given with slots is inserted, or keeps its stored slot unless its trigger
# changed. Rows are written in id order, so two registrations never deadlock. The slots
# travel as text[] (ISO 8601 with offset): asyncpg looks up any other array type in
# pg_type on each new connection, a query that costs a fresh backend tens of ms, and a
# promotion registers on a standby's pooled connections.
_UPSERT = text(
    """
    WITH given AS (
        SELECT * FROM unnest(CAST(:ids AS text[]), CAST(:names AS text[]),
            CAST(:triggers AS text[]), CAST(CAST(:first_slots AS text[]) AS timestamptz[]),
            CAST(CAST(:reset_slots AS text[]) AS timestamptz[]))
            AS g(id, name, trigger, first_slot, reset_slot)
    ), kept AS (
        UPDATE scheduler_jobs j SET name = g.name, leader_only = true, updated_at = now()
        FROM given g
        WHERE g.first_slot IS NULL AND j.schedule = :schedule AND j.id = g.id
            AND j.trigger = g.trigger
        RETURNING j.id, j.next_run_at, j.paused, j.run_requested_at, j.running_until
    ), upserted AS (
        INSERT INTO scheduler_jobs (schedule, id, name, trigger, leader_only, next_run_at)
        SELECT :schedule, id, name, trigger, true, first_slot FROM given
        WHERE first_slot IS NOT NULL ORDER BY id
        ON CONFLICT (schedule, id) DO UPDATE SET
            name = excluded.name,
            leader_only = excluded.leader_only,
            trigger = excluded.trigger,
            next_run_at = CASE
                WHEN scheduler_jobs.trigger <> excluded.trigger
                    THEN (SELECT reset_slot FROM given WHERE given.id = excluded.id)
                ELSE scheduler_jobs.next_run_at
            END,
            updated_at = now()
        RETURNING id, next_run_at, paused, run_requested_at, running_until
    )
    SELECT * FROM kept UNION ALL SELECT * FROM upserted
    """
)


# The registration's inserts are not marked as changes (migration 0016): the leader
# holds what it wrote. Every other insert of a job row is (a restore, a script).
_OWN_INSERTS = text("SELECT set_config('regent.registering', 'on', true)")

_MARK_BROKEN = text(
    """
    INSERT INTO scheduler_broken_jobs (schedule, job_id, error, since, pid, host)
    VALUES (:schedule, :job_id, :error, :now, :pid, :host)
    ON CONFLICT (schedule, job_id) DO UPDATE SET error = excluded.error, pid = excluded.pid,
        host = excluded.host
    """
)
_CLEAR_BROKEN = text(
    "DELETE FROM scheduler_broken_jobs WHERE schedule = :schedule AND job_id = ANY(:ids)"
)

# Each worker keeps its own slots of a per-worker job; the row shows the soonest
# upcoming one: a worker replaces a slot that has passed or is later than its own.
# Never on a row a leader fires (a leader of another release registered the job
# leader-only since): its next_run_at is the slot the leader claims.
_SHOW_REPLICA_SLOT = text(
    """
    UPDATE scheduler_jobs SET next_run_at = :slot
    WHERE schedule = :schedule AND id = :job_id AND NOT leader_only
        AND (next_run_at <= :now OR next_run_at > :slot)
    """
)

_UPSERT_REPLICA = text(
    """
    INSERT INTO scheduler_jobs (schedule, id, name, trigger, leader_only, next_run_at)
    VALUES (:schedule, :id, :name, :trigger, false, :first_slot)
    ON CONFLICT (schedule, id) DO UPDATE SET
        name = excluded.name, trigger = excluded.trigger, leader_only = false,
        updated_at = now()
    """
)

# A promotion retires the rows of its schedule that its registry lacks (a job removed
# from the code, or renamed) and brings back the retired rows it has: only rows whose
# mark is wrong are written. A row another transaction holds is left for the next
# promotion, never waited on.
_SETTLE_RETIREMENT = text(
    """
    WITH wrong AS (
        SELECT id, NOT (id = ANY(CAST(:ids AS text[]))) AS gone FROM scheduler_jobs
        WHERE schedule = :schedule
            AND (retired_at IS NULL) = NOT (id = ANY(CAST(:ids AS text[])))
        FOR UPDATE SKIP LOCKED
    )
    UPDATE scheduler_jobs j
    SET retired_at = CASE WHEN wrong.gone THEN now() END, updated_at = now()
    FROM wrong WHERE j.schedule = :schedule AND j.id = wrong.id
    RETURNING j.id, wrong.gone
    """
)


@dataclass(frozen=True)
class LeaderRow:
    """What registering a leader job writes: its first slot for a new row, and the
    slot a changed trigger restarts from. Both are None for a job stored with the same
    trigger, which keeps its stored slot: a row that is not so writes nothing."""

    id: str
    name: str
    trigger: str
    first_slot: datetime | None
    reset_slot: datetime | None

    @classmethod
    def of(
        cls,
        spec: JobSpec,
        now: datetime,
        zone: ZoneInfo,
        *,
        stored_trigger: str | None = None,
        first_slots: dict[Trigger, datetime] | None = None,
    ) -> LeaderRow:
        """The row of ``spec`` registered at ``now``; raises what its trigger raises.
        ``stored_trigger``: the trigger its stored row has; when it is the job's own,
        no slot is computed (a cron's slot math is what 10,000 jobs would wait on).
        ``first_slots``: each trigger's first slot at ``now``, filled in as computed,
        shared by the rows of one registration so a trigger is computed once."""
        trigger = spec.trigger.describe()
        if stored_trigger == trigger:
            return cls(spec.id, spec.name, trigger, None, None)
        slots = {} if first_slots is None else first_slots
        if spec.trigger not in slots:
            slots[spec.trigger] = spec.trigger.first_slot(now, zone)
        own_first_slot = slots[spec.trigger]
        first_slot = own_first_slot
        if spec.first_run is not None:
            first_slot = now + timedelta(seconds=spec.first_run)
        return cls(spec.id, spec.name, trigger, first_slot, own_first_slot)


class RegistrationStore(StoreBase):
    """The writes of registration (part of JobStore)."""

    async def register_leader_jobs(
        self, specs: Iterable[JobSpec], now: datetime, zone: ZoneInfo
    ) -> dict[str, JobRow]:
        """Upsert the leader's jobs in one statement; keep each stored countdown unless
        its trigger changed.

        ``first_run`` places the first slot of a job whose row does not exist yet (the
        first boot of the deployment): once per job row. A promotion or a restart never
        moves a stored slot, and a changed trigger restarts from its own first slot.
        Raises what any job's trigger or row raises; nothing is written then.
        """
        return await self.upsert_leader_rows([LeaderRow.of(spec, now, zone) for spec in specs])

    async def register_leader_job(self, spec: JobSpec, now: datetime, zone: ZoneInfo) -> JobRow:
        """Upsert one leader job's row in its own commit (see register_leader_jobs), so
        that a job whose row or first slot cannot be handled stops no other job. Raises
        JobRowBusyError when another transaction holds its row."""
        registered = await self.register_leader_jobs([spec], now, zone)
        if spec.id not in registered:
            raise JobRowBusyError(spec.id)
        return registered[spec.id]

    async def upsert_leader_rows(self, rows: Sequence[LeaderRow]) -> dict[str, JobRow]:
        """Write ``rows`` (see register_leader_jobs) in one statement and one commit;
        return each job's stored next slot and pause flag. A row without slots whose job
        has no row or another trigger by now is left out: register it with its slots.
        So is a row another transaction holds, never waited on, as in a claim."""
        if not rows:
            return {}
        async with self.engine.begin() as conn:
            await conn.execute(_OWN_INSERTS)
            held = await lock_free_rows(self, conn, [row.id for row in rows])
            rows = [row for row in rows if row.id not in held]
            if not rows:
                return {}
            return await self._upsert(conn, rows)

    async def _upsert(self, conn: AsyncConnection, rows: Sequence[LeaderRow]) -> dict[str, JobRow]:
        params = {
            "ids": [row.id for row in rows],
            "names": [row.name for row in rows],
            "triggers": [row.trigger for row in rows],
            "first_slots": [iso(row.first_slot) for row in rows],
            "reset_slots": [iso(row.reset_slot) for row in rows],
            "schedule": self.schedule,
        }
        result = await conn.execute(_UPSERT, params)
        return {
            row.id: JobRow.read(
                row.next_run_at, row.paused, row.run_requested_at, True, row.running_until
            )
            for row in result
        }

    async def settle_retirement(self, job_ids: Iterable[str]) -> tuple[list[str], list[str]]:
        """Mark retired every job row of the schedule whose id is not in ``job_ids``
        (the promoted leader's whole registry, per-worker jobs included), and unmark
        the retired rows whose id is; returns the ids newly retired and those brought
        back. A row another transaction holds is skipped, never waited on: the next
        promotion settles it."""
        async with self.engine.begin() as conn:
            result = await conn.execute(
                _SETTLE_RETIREMENT, {"ids": list(job_ids), "schedule": self.schedule}
            )
            settled = list(result)
        retired = sorted(row.id for row in settled if row.gone)
        return retired, sorted(row.id for row in settled if not row.gone)

    async def mark_broken(self, job_id: str, error: str, now: datetime) -> None:
        """Record that the leader cannot handle the job's row or next slot."""
        async with self.engine.begin() as conn:
            await conn.execute(
                _MARK_BROKEN,
                {
                    "job_id": job_id,
                    "error": error,
                    "now": now,
                    "pid": self.pid,
                    "host": self.host,
                    "schedule": self.schedule,
                },
            )

    async def clear_broken(self, job_ids: Iterable[str]) -> None:
        """Forget that these jobs were broken: their registration or claim succeeded."""
        async with self.engine.begin() as conn:
            await conn.execute(_CLEAR_BROKEN, {"ids": list(job_ids), "schedule": self.schedule})

    async def show_replica_slot(self, job_id: str, slot: datetime, now: datetime) -> None:
        """Show ``slot`` as the per-worker job's next run unless another worker's
        upcoming slot is sooner, or a leader fires the job now (its row is
        leader-only)."""
        async with self.engine.begin() as conn:
            await conn.execute(
                _SHOW_REPLICA_SLOT,
                {"job_id": job_id, "slot": slot, "now": now, "schedule": self.schedule},
            )

    async def register_replica_jobs(
        self, specs: Iterable[JobSpec], now: datetime, zone: ZoneInfo
    ) -> None:
        """Make sure every per-replica job has a row, so its runs can be recorded."""
        for spec in specs:
            await self.register_replica_job(spec, now, zone)

    async def register_replica_job(self, spec: JobSpec, now: datetime, zone: ZoneInfo) -> None:
        """Make sure one per-replica job has a row, in its own commit."""
        first_slot = spec.trigger.first_slot(now, zone)
        async with self.engine.begin() as conn:
            await conn.execute(
                _UPSERT_REPLICA,
                {
                    "id": spec.id,
                    "name": spec.name,
                    "trigger": spec.trigger.describe(),
                    "first_slot": first_slot,
                    "schedule": self.schedule,
                },
            )
