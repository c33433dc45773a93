"""What operators read and change: shared by the admin API, the admin page and the CLI.

Every function takes an engine and plain values, and raises AdminError subclasses whose
messages name the problem.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.outbox import (
    MessageBusyError,
    MessageDeliveredError,
    MessageInFlightError,
    UnknownMessageError,
    reset_message,
)
from app.outbox.sql import SCHEDULED
from app.scheduler.clock import LEASE_NOW_SQL
from app.scheduler.election import WAKE_CHANNEL
from app.scheduler.host_standbys import HOST_STANDBYS_SQL
from app.scheduler.keys import DEFAULT_SCHEDULE, LEADER_KEY_LOCKS_BOUND, LeaderKey
from app.scheduler.rowlocks import RowHeldError, held_by_sql, patient_write, row_holder
from app.scheduler.store.leases import leader_run_leased_sql
from app.storable import is_int64, is_storable_text

from .errors import AdminError, Conflict, NotFound, UnknownJobError
from .run_status import check_run_status

__all__ = [
    "DELIVERED_WINDOW_SECONDS",
    "AdminError",
    "forget_job",
    "job_runs",
    "leader",
    "lease_clock_now",
    "list_jobs",
    "manual_run",
    "outbox_messages",
    "outbox_summary",
    "require_outbox",
    "reset_outbox_message",
    "run_job_now",
    "set_paused",
    "stuck_messages",
]

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
# A page of a job's runs, newest first: read through (schedule, job_id, id DESC), or,
# filtered by status, through (schedule, job_id, status, id DESC) (migration 0024), so
# that a status the job rarely has costs the page, not a scan of the job's history.
# Two statements rather than "status IS NULL OR": a generic plan cannot drop that OR.
_RUNS_PAGE = """
    SELECT r.id, r.slot, r.started_at, r.finished_at, r.status, r.lateness_ms, r.duration_ms,
        r.pid, r.host, r.error, r.manual
    FROM scheduler_runs r
    WHERE r.schedule = :schedule AND r.job_id = :job_id {status}
        AND (CAST(:before AS bigint) IS NULL OR r.id < :before)
    ORDER BY r.id DESC LIMIT :limit
    """
_RUNS = text(_RUNS_PAGE.format(status=""))
_RUNS_OF_STATUS = text(_RUNS_PAGE.format(status="AND r.status = :status"))
_JOB = text("SELECT 1 FROM scheduler_jobs WHERE schedule = :schedule AND id = :job_id")
# What an operator's write of a job may do (run now, forget), read on the lease clock,
# and the row locked until the write is done: a claim of the job waits for it, so
# "running" cannot change in between.
_JOB_STATE = text(
    f"""
    SELECT leader_only, paused, retired_at IS NOT NULL AS retired,
        {leader_run_leased_sql("j")} AS running
    FROM scheduler_jobs j WHERE schedule = :schedule AND id = :job_id FOR UPDATE
    """
)
# A request beside the schedule (see app/scheduler/store.py): next_run_at is never
# touched. A request still pending stays: asking twice before the leader takes it is
# one run.
_RUN_NOW = text(
    f"UPDATE scheduler_jobs SET run_requested_at = COALESCE(run_requested_at, {LEASE_NOW_SQL}),"
    " updated_at = now() WHERE schedule = :schedule AND id = :job_id RETURNING run_requested_at"
)
# The manual run a request (its time, the run's slot) became.
_MANUAL_RUN = text(
    """
    SELECT r.id, r.slot, r.started_at, r.finished_at, r.status, r.lateness_ms, r.duration_ms,
        r.pid, r.host, r.error, r.manual
    FROM scheduler_runs r
    WHERE r.schedule = :schedule AND r.job_id = :job_id AND r.manual AND r.slot = :slot
    ORDER BY r.id DESC LIMIT 1
    """
)
# Pausing drops a pending request: a paused job runs nothing, and a resume does not
# bring back a run asked for before the pause.
_PAUSE = text(
    """
    UPDATE scheduler_jobs
    SET paused = :paused,
        run_requested_at = CASE WHEN :paused THEN NULL ELSE run_requested_at END,
        updated_at = now()
    WHERE schedule = :schedule AND id = :job_id RETURNING id
    """
)
_WAKE = text(f"NOTIFY {WAKE_CHANNEL}")
_JOB_ROW_HOLDER = row_holder("scheduler_jobs", "schedule = :schedule AND id = :job_id")
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
# Per outbox, what costs what its live work costs, never what its history holds: the
# pending rows, apart from the scheduled ones (delayed messages whose moment is ahead),
# and the stuck rows (each read through its partial index), the oldest pending row's
# age on the lease clock (which rows are stamped on; a delayed message's counts from its
# moment, and a scheduled one has none yet), and the rows delivered in the last
# DELIVERED_WINDOW_SECONDS (a window read through outbox_messages_delivered, never a
# count of every delivered row: retention keeps those for OUTBOX_DELIVERED_DAYS). The
# outboxes listed: every one claimed by a schedule, drained, or with live rows. One
# statement, so one snapshot: a message enqueued meanwhile is counted whole or not at
# all, never taken from one status without being added to another.
DELIVERED_WINDOW_SECONDS = 3600
_OUTBOXES = text(
    f"""
    WITH live AS (
        SELECT outbox, count(*) FILTER (WHERE NOT {SCHEDULED}) AS pending,
            count(*) FILTER (WHERE {SCHEDULED}) AS scheduled, 0 AS stuck,
            min(GREATEST(deliver_at, created_at)) FILTER (WHERE NOT {SCHEDULED})
                AS oldest_pending
        FROM outbox_messages WHERE status = 'pending' GROUP BY outbox
        UNION ALL
        SELECT outbox, 0, 0, count(*), NULL
        FROM outbox_messages WHERE status = 'stuck' GROUP BY outbox
    ), names AS (
        SELECT outbox FROM outbox_schedules
        UNION SELECT outbox FROM outbox_drains
        UNION SELECT outbox FROM live
    )
    SELECT n.outbox,
        coalesce((SELECT sum(l.pending) FROM live l WHERE l.outbox = n.outbox), 0)::bigint
            AS pending,
        coalesce((SELECT sum(l.scheduled) FROM live l WHERE l.outbox = n.outbox), 0)::bigint
            AS scheduled,
        coalesce((SELECT sum(l.stuck) FROM live l WHERE l.outbox = n.outbox), 0)::bigint
            AS stuck,
        (SELECT count(*) FROM outbox_messages d
         WHERE d.outbox = n.outbox AND d.status = 'delivered'
            AND d.delivered_at > (SELECT {LEASE_NOW_SQL}
                - make_interval(secs => {DELIVERED_WINDOW_SECONDS}))) AS delivered,
        extract(epoch FROM {LEASE_NOW_SQL}
            - (SELECT min(l.oldest_pending) FROM live l WHERE l.outbox = n.outbox))::float
            AS oldest_pending_seconds
    FROM names n
    """
)
_NO_JIT = text("SET LOCAL jit = off")
_DRAINS = text("SELECT outbox, last_drain_at, delivered, retried, stuck FROM outbox_drains")
_KNOWN_OUTBOX = text(
    "SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE outbox = :outbox)"
    " OR EXISTS (SELECT 1 FROM outbox_drains WHERE outbox = :outbox)"
)
_STUCK = text(
    """
    SELECT id, outbox, key, payload, attempts, last_error, created_at, updated_at
    FROM outbox_messages
    WHERE status = 'stuck' AND (CAST(:outbox AS text) IS NULL OR outbox = :outbox)
    ORDER BY id LIMIT :limit
    """
)
_PENDING = text(
    f"""
    SELECT id, outbox, key, payload, attempts, next_attempt_at, last_error, created_at,
        updated_at
    FROM outbox_messages
    WHERE status = 'pending' AND NOT {SCHEDULED}
        AND (CAST(:outbox AS text) IS NULL OR outbox = :outbox)
    ORDER BY next_attempt_at, id LIMIT :limit
    """
)
_SCHEDULED = text(
    f"""
    SELECT id, outbox, key, payload, deliver_at, created_at
    FROM outbox_messages
    WHERE {SCHEDULED} AND (CAST(:outbox AS text) IS NULL OR outbox = :outbox)
    ORDER BY deliver_at, id LIMIT :limit
    """
)
_MESSAGES_BY_STATUS = {"stuck": _STUCK, "pending": _PENDING, "scheduled": _SCHEDULED}


_LEASE_CLOCK_NOW = text(f"SELECT {LEASE_NOW_SQL}")


async def lease_clock_now(engine: AsyncEngine, lease_now: datetime | None = None) -> datetime:
    """Now on the lease clock, which every lease and due time is on: ``lease_now`` as
    clock.lease_now gives it, None for the database server's clock (read from it)."""
    async with engine.connect() as conn:
        read: datetime = (
            await conn.execute(_LEASE_CLOCK_NOW, {"lease_now": lease_now})
        ).scalar_one()
        return read


def _rows(result: Any) -> list[dict[str, Any]]:
    return [{key: _aware(value) for key, value in row._mapping.items()} for row in result]


def _aware(value: Any) -> Any:
    # asyncpg reads a timestamptz 'infinity' (an operator's "never") or '-infinity' as
    # a naive datetime.max or .min; every other one is aware. Made aware (UTC), they
    # compare, sort and serialize as the rest do; display.timestamp() says "never" for
    # the first.
    if isinstance(value, datetime) and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


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
    backend pid of a transaction holding its row (None when none does). Every
    function here reads or changes only the rows of the schedule it is given
    (app/scheduler/keys.py)."""
    async with engine.connect() as conn:
        params = {"lease_now": lease_now, "schedule": schedule, "retired": retired}
        return _rows(await conn.execute(_JOBS, params))


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


async def _require_job(conn: Any, job_id: str, schedule: str) -> Any:
    # A value no text column can hold names no row; asking would be a driver error.
    if not is_storable_text(job_id):
        raise UnknownJobError(job_id, schedule)
    row = (await conn.execute(_JOB, {"job_id": job_id, "schedule": schedule})).first()
    if row is None:
        raise UnknownJobError(job_id, schedule)
    return row


async def job_runs(
    engine: AsyncEngine,
    job_id: str,
    *,
    limit: int = 50,
    before: int | None = None,
    schedule: str = DEFAULT_SCHEDULE,
    status: str | None = None,
) -> list[dict[str, Any]]:
    """A page of the job's runs, newest first, only those of ``status`` when it is
    given; ``before`` is the last id of the previous page. Raises UnknownJobError (a
    NotFound) for an unknown job, UnknownRunStatusError (a 400) for a status no run can
    have (run_status.RUN_STATUSES)."""
    check_run_status(status)
    async with engine.connect() as conn:
        await _require_job(conn, job_id, schedule)
        params = {
            "job_id": job_id,
            "limit": limit,
            "before": before,
            "schedule": schedule,
            "status": status,
        }
        result = await conn.execute(_RUNS if status is None else _RUNS_OF_STATUS, params)
        return _rows(result)


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

    Raises UnknownJobError (a NotFound) for an unknown job, and Conflict while it runs
    (its running lease holds, read on the lease clock as in list_jobs: ``lease_now``,
    None for the database server's), while it is paused, and for a per-worker job
    (``leader_only=False``): each worker runs that on its own schedule, and no leader
    takes a request for it. Waits for a claim of the job's next slot that holds its row
    (at most CLAIM_AHEAD_SECONDS); Conflict when the row stays locked much longer.
    """
    if not is_storable_text(job_id):
        raise UnknownJobError(job_id, schedule)
    async with _job_write(engine, job_id, schedule) as conn:
        params = {"job_id": job_id, "lease_now": lease_now, "schedule": schedule}
        row = (await conn.execute(_JOB_STATE, params)).first()
        if row is None:
            raise UnknownJobError(job_id, schedule)
        if not row.leader_only:
            raise Conflict(
                f"job {job_id!r} runs on every worker on its own schedule (leader_only=False), "
                "so it cannot be run now; each worker runs it at its next slot"
            )
        if row.retired:
            raise Conflict(
                f"job {job_id!r} is retired: the leader of schedule {schedule!r} no longer "
                "registers it, so nothing would run it; register it again, or forget it"
            )
        if row.running:
            raise Conflict(f"job {job_id!r} is running; try again when it has finished")
        if row.paused:
            raise Conflict(f"job {job_id!r} is paused; resume it first")
        requested: datetime = (await conn.execute(_RUN_NOW, params)).scalar_one()
        await conn.execute(_WAKE)
    return requested


async def manual_run(
    engine: AsyncEngine, job_id: str, requested: datetime, *, schedule: str = DEFAULT_SCHEDULE
) -> dict[str, Any] | None:
    """The run that the run-now request of ``requested`` (what run_job_now returned)
    became, as job_runs gives it; None while the leader has not claimed it."""
    params = {"job_id": job_id, "slot": requested, "schedule": schedule}
    async with engine.connect() as conn:
        rows = _rows(await conn.execute(_MANUAL_RUN, params))
    return rows[0] if rows else None


_FORGET_RUNS = text("DELETE FROM scheduler_runs WHERE schedule = :schedule AND job_id = :job_id")
_FORGET_JOB = text(
    """
    WITH broken AS (
        DELETE FROM scheduler_broken_jobs WHERE schedule = :schedule AND job_id = :job_id
    )
    DELETE FROM scheduler_jobs WHERE schedule = :schedule AND id = :job_id
    """
)


async def forget_job(engine: AsyncEngine, job_id: str, *, schedule: str = DEFAULT_SCHEDULE) -> int:
    """Delete a retired job's row and its whole run history, in one transaction;
    returns how many runs went. Raises UnknownJobError for an unknown job and Conflict
    for a job its schedule's leader still registers (remove it from the code first:
    forgetting a live job would lose the history of a job that runs)."""
    if not is_storable_text(job_id):
        raise UnknownJobError(job_id, schedule)
    async with _job_write(engine, job_id, schedule) as conn:
        # Read on the database server's clock, as every lease is.
        params = {"job_id": job_id, "schedule": schedule, "lease_now": None}
        row = (await conn.execute(_JOB_STATE, params)).first()
        if row is None:
            raise UnknownJobError(job_id, schedule)
        if not row.retired:
            raise Conflict(
                f"job {job_id!r} is registered by the leader of schedule {schedule!r}; "
                "remove it from the code and deploy first (a promotion then retires it)"
            )
        if row.running:
            # A body of an older release may still run it: its outcome needs the run.
            raise Conflict(f"job {job_id!r} is running; forget it when it has finished")
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
    row stays locked much longer."""
    async with _job_write(engine, job_id, schedule) as conn:
        await _require_job(conn, job_id, schedule)
        params = {"job_id": job_id, "paused": paused, "schedule": schedule}
        if (await conn.execute(_PAUSE, params)).first() is None:
            raise UnknownJobError(job_id, schedule)
        await conn.execute(_WAKE)


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
    (read on the lease clock as in list_jobs: ``lease_now``, None for the database
    server's), ``job_ids`` (the leader-only jobs it fires) and ``service_ids`` (the
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


async def outbox_summary(
    engine: AsyncEngine, lease_now: datetime | None = None
) -> list[dict[str, Any]]:
    """Per outbox: ``counts`` of its pending, scheduled and stuck rows and of the rows
    it delivered in the last ``delivered_window_seconds`` (DELIVERED_WINDOW_SECONDS: a
    window, so that the answer costs what the live work costs, not the delivered
    history), the oldest pending age in seconds, the last drain. ``scheduled`` counts
    the delayed messages whose moment is ahead, apart from ``pending`` (due, or waiting
    for a retry). The ages, and what is scheduled, are read on the lease clock, which
    rows are stamped on: ``lease_now`` as clock.lease_now gives it, None for the
    database server's clock."""
    summary: dict[str, dict[str, Any]] = {}
    async with engine.begin() as conn:
        # The planner cannot size the window (its bound is read at run time) and
        # prices it at a third of the delivered rows: with a million of them that
        # passes jit_above_cost, and compiling the plan takes seconds for a read of
        # milliseconds.
        await conn.execute(_NO_JIT)
        for row in await conn.execute(_OUTBOXES, {"lease_now": lease_now}):
            entry = summary.setdefault(row.outbox, _empty_outbox(row.outbox))
            entry["counts"] = {
                "pending": row.pending,
                "scheduled": row.scheduled,
                "delivered": row.delivered,
                "stuck": row.stuck,
            }
            entry["oldest_pending_seconds"] = row.oldest_pending_seconds
        for row in await conn.execute(_DRAINS):
            entry = summary.setdefault(row.outbox, _empty_outbox(row.outbox))
            entry["last_drain_at"] = row.last_drain_at
    return [summary[name] for name in sorted(summary)]


def _empty_outbox(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "counts": {"pending": 0, "scheduled": 0, "delivered": 0, "stuck": 0},
        "delivered_window_seconds": DELIVERED_WINDOW_SECONDS,
        "oldest_pending_seconds": None,
        "last_drain_at": None,
    }


async def require_outbox(engine: AsyncEngine, outbox: str) -> None:
    """Raise NotFound, naming the outbox, unless it has rows or a drain's record."""
    async with engine.connect() as conn:
        known = (
            is_storable_text(outbox)
            and (await conn.execute(_KNOWN_OUTBOX, {"outbox": outbox})).scalar()
        )
        if not known:
            raise NotFound(f"no outbox named {outbox!r}; `python -m app outbox list` lists them")


async def stuck_messages(
    engine: AsyncEngine, outbox: str | None = None, *, limit: int = 100
) -> list[dict[str, Any]]:
    """Stuck rows, oldest first, of one outbox or all. Raises NotFound for an unknown one."""
    return await outbox_messages(engine, outbox, status="stuck", limit=limit)


async def outbox_messages(
    engine: AsyncEngine,
    outbox: str | None = None,
    *,
    status: Literal["stuck", "pending", "scheduled"],
    limit: int = 100,
    lease_now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Rows of one status, of one outbox or all: stuck rows oldest first with their last
    error, pending rows in the order the drain takes them, scheduled rows (delayed
    messages whose moment, ``deliver_at``, is ahead on the lease clock: ``lease_now``
    as clock.lease_now gives it) soonest first. Raises NotFound for an unknown outbox."""
    if outbox is not None:
        await require_outbox(engine, outbox)
    async with engine.connect() as conn:
        query = _MESSAGES_BY_STATUS[status]
        params = {"outbox": outbox, "limit": limit, "lease_now": lease_now}
        return _rows(await conn.execute(query, params))


async def reset_outbox_message(
    engine: AsyncEngine, outbox: str, message_id: int, lease_now: datetime | None = None
) -> None:
    """Make a stuck row, or a pending one no drain holds, pending with attempts 0 and
    due now, both read on the lease clock (``lease_now`` as clock.lease_now gives it,
    None for the database server's; never the operator's own clock). NotFound for an
    unknown outbox or id; Conflict for a delivered row, one a drain is delivering (the
    message says to wait for it), and one another transaction holds past the wait of
    an operator's write (the message names its backend pid)."""
    await require_outbox(engine, outbox)
    if not is_int64(message_id):
        raise NotFound(f"outbox {outbox!r} has no message {message_id}; no id is that large")
    try:
        await reset_message(engine, outbox, message_id, lease_now)
    except UnknownMessageError as exc:
        raise NotFound(str(exc)) from None
    except (MessageBusyError, MessageDeliveredError, MessageInFlightError) as exc:
        raise Conflict(str(exc)) from None
