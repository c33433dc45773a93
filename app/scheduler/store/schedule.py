"""The schedule's own rows: its name's registration with its leader key, and the
leadership row (the heartbeat, the live leader's jobs and services)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from ..clock import LEASE_NOW_SQL
from ..errors import ScheduleNameCollisionError
from ..keys import LEADER_KEY_LOCKS_BOUND
from .base import StoreBase

__all__ = ["LeaderJobs", "ScheduleStore"]

# On the lease clock, as the readers of the heartbeat compare it (app/admin/health.py):
# a leader whose own clock runs behind still reads as firing.
_SERVER_NOW = text("SELECT clock_timestamp()")
_HEARTBEAT = text(
    f"UPDATE scheduler_leadership SET heartbeat_at = {LEASE_NOW_SQL}"
    " WHERE schedule = :schedule AND backend_pid = :backend_pid"
)

# Register the schedule's name with its key's pg_locks coordinates, and read back every
# registered name that has the name or the key. The UNIQUE key constraint makes a second
# name with the same key a conflict (nothing inserted); the rows read are the
# statement's snapshot, so a conflicting row committed meanwhile may be missing: the
# caller asks again until a row answers.
_REGISTER_SCHEDULE = text(
    """
    WITH registered AS (
        INSERT INTO scheduler_schedules AS s (name, key_classid, key_objid, key_objsubid)
        VALUES (:schedule, :key_classid, :key_objid, :key_objsubid) ON CONFLICT DO NOTHING
        RETURNING s.name, s.key_classid, s.key_objid, s.key_objsubid)
    SELECT * FROM registered
    UNION ALL
    SELECT name, key_classid, key_objid, key_objsubid FROM scheduler_schedules
    WHERE name = :schedule OR (key_classid, key_objid, key_objsubid)
        = (CAST(:key_classid AS bigint), CAST(:key_objid AS bigint), CAST(:key_objsubid AS int))
    """
)

# The leader of this schedule that holds its key now, and the jobs and services it
# recorded running.
_LEADER_JOBS = text(
    f"""
    SELECT s.pid, s.host, s.job_ids, s.service_ids FROM scheduler_leadership s
    WHERE s.schedule = :schedule AND EXISTS (
        SELECT 1 FROM pg_locks WHERE {LEADER_KEY_LOCKS_BOUND} AND granted
            AND pid = s.backend_pid)
    """
)


@dataclass(frozen=True)
class LeaderJobs:
    """The live leader of a schedule (process ``pid`` on ``host``) and the ids of the
    leader-only jobs and of the services it recorded at its promotion; ``service_ids``
    is None for a leader of a release that did not record them."""

    pid: int
    host: str
    job_ids: frozenset[str]
    service_ids: frozenset[str] | None


class ScheduleStore(StoreBase):
    """The schedule's registration and leadership rows (part of JobStore)."""

    async def server_now(self) -> datetime:
        """The database server's clock (``clock_timestamp()``), read in one round trip;
        raises what the database raises."""
        async with self.engine.connect() as conn:
            now: datetime = (await conn.execute(_SERVER_NOW)).scalar_one()
        return now

    async def heartbeat(self, backend_pid: int, now: datetime) -> None:
        """Note that the leader on lock backend ``backend_pid`` still fires, at ``now``
        as the lease clock reads it (the database server's, see clock.lease_clock)."""
        params = {"backend_pid": backend_pid, "schedule": self.schedule} | self.lease_params(now)
        async with self.engine.begin() as conn:
            await conn.execute(_HEARTBEAT, params)

    async def register_schedule(self) -> None:
        """Register this schedule's name with its leader key in scheduler_schedules (once
        per database; later calls only read), on the app's engine: the lock connection's
        role may have no rights on the app's tables.

        Raises ScheduleNameCollisionError when another name holds the same key there,
        and ConnectionError when the app database does not answer.
        """
        params = {"schedule": self.schedule} | self.key.bind_params
        try:
            rows: list[Any] = []
            while not rows:
                async with self.engine.begin() as conn:
                    rows = list(await conn.execute(_REGISTER_SCHEDULE, params))
        except DBAPIError as exc:
            raise ConnectionError(f"the app database did not answer: {exc}") from exc
        coordinates = (self.key.classid, self.key.objid, self.key.objsubid)
        for row in rows:
            if row.name != self.schedule or tuple(row)[1:] != coordinates:
                raise ScheduleNameCollisionError(self.schedule, row.name)

    async def leader_jobs(self) -> LeaderJobs | None:
        """The leader that holds this schedule's key now and the jobs and services it
        runs; None when nobody holds it or the holder has not recorded its leadership
        yet."""
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(_LEADER_JOBS, {"schedule": self.schedule} | self.key.bind_params)
            ).first()
        if row is None:
            return None
        services = None if row.service_ids is None else frozenset(row.service_ids)
        return LeaderJobs(row.pid, row.host, frozenset(row.job_ids), services)
