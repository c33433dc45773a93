"""The schedule's leadership as operators read it: who holds the leader key, what its
leadership row says, and how many standbys wait for it.

Shared by the admin API, the CLI and /health/scheduler.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.scheduler.clock import LEASE_NOW_SQL
from app.scheduler.host_standbys import HOST_STANDBYS_SQL
from app.scheduler.keys import DEFAULT_SCHEDULE, LEADER_KEY_LOCKS_BOUND, LeaderKey

__all__ = ["leader"]

# The key is the schedule's own unless scheduler_schedules gives it to another name: a
# name refused for a colliding key would otherwise count the other name's leader and
# standbys as its own.
_KEY_IS_OURS = """
    NOT EXISTS (
        SELECT 1 FROM scheduler_schedules other
        WHERE other.name <> CAST(:schedule AS text)
            AND (other.key_classid, other.key_objid, other.key_objsubid) = (
                CAST(:key_classid AS bigint), CAST(:key_objid AS bigint),
                CAST(:key_objsubid AS int)))
    """
# The schedule's key holder, by the shared pg_locks predicate on bind parameters
# (LeaderKey.bind_params); its leadership row is the schedule's. The heartbeat's age is
# read on the lease clock, which the leader writes it on.
_LEADER = text(
    f"""
    SELECT a.pid AS backend_pid, a.application_name, a.client_addr::text AS client_addr,
        s.pid, s.host, s.since, s.heartbeat_at, s.job_ids, s.service_ids,
        extract(epoch FROM {LEASE_NOW_SQL} - s.heartbeat_at)::float AS heartbeat_age_seconds
    FROM (SELECT pid FROM pg_locks WHERE {LEADER_KEY_LOCKS_BOUND} AND granted) l
    JOIN pg_stat_activity a ON a.pid = l.pid
    LEFT JOIN scheduler_leadership s
        ON s.schedule = CAST(:schedule AS text) AND s.backend_pid = l.pid
    WHERE {_KEY_IS_OURS}
    """
)
# Standbys on the key (sessions waiting in pg_advisory_lock), and the workers waiting
# behind their host's lock file, which have no session waiting (host_standbys.py).
_STANDBYS = text(
    f"""
    SELECT (SELECT count(*) FROM pg_locks
            WHERE {LEADER_KEY_LOCKS_BOUND} AND NOT granted AND {_KEY_IS_OURS}) AS on_key,
        {HOST_STANDBYS_SQL} AS behind_host_lock
    """
)


async def leader(
    engine: AsyncEngine,
    *,
    lease_now: datetime | None = None,
    schedule: str = DEFAULT_SCHEDULE,
) -> dict[str, Any]:
    """The holder of the schedule's leader key (None fields when nobody leads) and the
    number of standbys waiting for it, from pg_locks and pg_stat_activity:
    ``standbys`` in all, ``standbys_on_key`` (sessions waiting for the key) and
    ``standbys_behind_host_lock`` (workers waiting for their host's lock file, whose
    lease on the lease clock holds: app/scheduler/host_standbys.py); ``since``,
    ``heartbeat_at`` (its last tick that found it firing), ``heartbeat_age_seconds``
    (read on the lease clock: ``lease_now`` as clock.lease_now gives it, None for
    the database server's), ``job_ids`` (the leader-only jobs it fires) and ``service_ids`` (the
    services it runs) when the holder has recorded its leadership. A key that
    scheduler_schedules gives to another name (a colliding name, refused at start) has
    no holder or standby of this schedule.

    A standby whose process died leaves the count within the lock connection's client
    check (CLIENT_CHECK_SECONDS), not at the next handover.
    """
    async with engine.connect() as conn:
        key = LeaderKey.of(schedule).bind_params
        params = key | {"schedule": schedule}
        holder = (await conn.execute(_LEADER, params | {"lease_now": lease_now})).first()
        standbys = (await conn.execute(_STANDBYS, params | {"lease_now": lease_now})).one()
    info: dict[str, Any] = {
        "pid": None,
        "application_name": None,
        "host": None,
        "client_addr": None,
        "backend_pid": None,
        "since": None,
        "heartbeat_at": None,
        "heartbeat_age_seconds": None,
        "job_ids": None,
        "service_ids": None,
    }
    if holder is not None:
        info |= dict(holder._mapping)
    return (
        {"schedule": schedule}
        | info
        | {
            "standbys": standbys.on_key + standbys.behind_host_lock,
            "standbys_on_key": standbys.on_key,
            "standbys_behind_host_lock": standbys.behind_host_lock,
        }
    )
