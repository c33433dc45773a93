"""The scheduler's tables: job rows, slot claims and run history.

The claim is the heart of at-most-once: a conditional UPDATE that moves a job's
``next_run_at`` from the due slot to the next one, committed with the run's history row
before the body runs. Two processes that both think a slot is due race on that
UPDATE, and PostgreSQL lets exactly one of them match the row. A claim never waits on
a row: it first locks the rows of its jobs that no other transaction holds (SKIP
LOCKED) and updates only those; a held row (an operator's open transaction) leaves its
job out, answered ``JobRowBusyError``, and its claim is made again later. A leader
claims every slot due at one wake of its timer in ONE such UPDATE over the jobs' rows
(``claim_many``), each row under the conditions it would meet alone; the one-job
claim is its one-row case. A claim may be *prepared* ahead of its slot
(``PreparedCommit``): its statements run early, its transaction holds the claimed rows
until the slot, and only the commit is left for the slot itself, so a thousand bodies
that share a slot start on time; a demotion before the commit rolls it back and leaves
the slot to the next leader. A guarded leader adds a
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

Leases are given as lengths and measured on the *lease clock*: the database server's
(``clock_timestamp()``), the one clock every process shares, or a test's FakeClock
(``lease_now``; see clock.lease_clock). A host's clock never decides whether another
host's run still lives.

The lease is also the truth for "running": a skipped or missed slot never overwrites
the job's ``running`` status while a lease holds, and a lease that ran out (its owner
died) is *reaped*: its run and the job's status become ``abandoned`` and the lease is
cleared, by the leader every tick and by the claim that takes the job over. A process
never reaps a lease it renews itself (``JobStore.renewing``): the body runs there.

A service copy holds a running lease on its service's row (``scheduler_services``),
taken as it starts, only while no other copy's lease holds, renewed with every other
lease of its process and released (with a NOTIFY that wakes a leader waiting for it)
once the copy's task and every thread it started ended. Every lease's token is a run
id, so the leases a process renews are told apart by token alone.

A per-worker run (``scope = 'replica'``) holds its lease on its own run row instead
(``scheduler_runs.running_until``): every worker runs the job at once, so the job row
cannot hold one lease for them. It is set by the insert that starts the run, renewed
by the run id, and cleared by the outcome; it holds no claim back. The start also sets
the job's last status to 'running' (the outcome settles it), and the job reads as
running while any of its run leases holds. A run whose lease ran out is reaped to
``abandoned`` by the leader's tick (the same reap) and by the job's next run on any
worker, so it is reaped even while no worker leads.

*Run now* is a request beside the schedule, never a move of it: the operator's request
sets ``run_requested_at`` (app/admin/queries.py) and the leader claims it with the same
UPDATE, matched on the request instead of the slot, which clears the request instead of
moving ``next_run_at``. Its run row is ``manual``, its slot is the request time and the
one-run-per-slot index keeps manual and scheduled runs apart, so a request never takes
the place of a slot, nor a slot of a request.

A job whose row or next slot the leader cannot handle is recorded in
``scheduler_broken_jobs`` (a table of its own: the job's row may be what cannot be
written) until a later registration or claim of it succeeds.
"""

from __future__ import annotations

import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Session, sessionmaker

from app.storable import escape_unstorable

# Running leases are written and compared on the lease clock (see clock.LEASE_NOW_SQL):
# the database server's (:lease_now NULL), or a test's shared fake clock.
from .clock import LEASE_END_SQL as _LEASE_END
from .clock import LEASE_NOW_SQL, Clock
from .errors import JobRowBusyError, ScheduleNameCollisionError
from .keys import DEFAULT_SCHEDULE, LEADER_KEY_LOCKS_BOUND, WAKE_CHANNEL, LeaderKey
from .registry import JobSpec
from .triggers import Trigger

__all__ = [
    "ChangedRows",
    "ClaimedSlot",
    "HeldLease",
    "JobRow",
    "JobStore",
    "LeaderJobs",
    "LeaderRow",
    "LeaseKind",
    "Outcome",
    "ReapedRun",
    "ServiceTake",
    "SlotClaim",
    "StoredJob",
    "StoredJobs",
    "ThreadStore",
    "format_error",
]

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


def _iso(moment: datetime | None) -> str | None:
    """An aware datetime as PostgreSQL reads a timestamptz from text."""
    return None if moment is None else moment.isoformat()


# The registration's inserts are not marked as changes (migration 0016): the leader
# holds what it wrote. Every other insert of a job row is (a restore, a script).
# A prepared claim's transaction idles until its slot: the server ends the session if it
# idles a few seconds longer than planned (its process froze), which rolls the claim
# back. It also reads the server's moment of the start (now + lead).
_PREPARE = text(
    "SELECT set_config('idle_in_transaction_session_timeout', :ms, true) AS idle_limit,"
    " clock_timestamp() + make_interval(secs => CAST(:lead AS double precision)) AS at_start"
)
_PREPARED_IDLE_SLACK = 3.0
# A prepared claim's fence, checked again right before it commits.
_STILL_FENCED = text(
    f"SELECT EXISTS (SELECT 1 FROM pg_locks WHERE {LEADER_KEY_LOCKS_BOUND}"
    " AND granted AND pid = :fence_pid)"
)
_OWN_INSERTS = text("SELECT set_config('regent.registering', 'on', true)")

_LOAD = text(
    "SELECT id, next_run_at, paused, run_requested_at, leader_only, running_until"
    " FROM scheduler_jobs WHERE schedule = :schedule AND id = ANY(:ids)"
)

# Change marks (migration 0016): every update of a job row's schedule state sets its
# changed_xid to the writing transaction's id, whoever writes it. A read's *horizon* is
# the xmin of its snapshot: every transaction it could not see (under way then, or
# begun since) has an id at or above it. So the rows whose changed_xid is at or above a
# read's horizon include every change that read missed, and a leader that holds what
# one read saw catches up by reading only those, however many rows there are.
_HORIZON = "CAST(pg_snapshot_xmin(pg_current_snapshot()) AS text)"
# A promotion's read: the horizon before the rows (a change committed in between is
# read twice, never missed), and the schedule's broken marks.
_PROMOTION_HORIZON = text(
    f"SELECT {_HORIZON} AS horizon, ARRAY(SELECT job_id FROM scheduler_broken_jobs"
    " WHERE schedule = :schedule) AS broken"
)
_STORED_JOBS = text(
    "SELECT id, name, trigger, leader_only, next_run_at, paused, run_requested_at,"
    " running_until FROM scheduler_jobs WHERE schedule = :schedule"
)
_ANALYZE_JOBS = text("ANALYZE scheduler_jobs")
# The rows changed at or after a horizon, each with this read's own horizon. A row never
# changed since inserted (0) is never read: a horizon is above it, and the partial index
# of the marks leaves it out.
_CHANGED_JOBS = text(
    f"""
    SELECT {_HORIZON} AS horizon, id, next_run_at, paused, run_requested_at, leader_only,
        running_until
    FROM scheduler_jobs
    WHERE schedule = :schedule AND changed_xid <> '0'
        AND changed_xid >= CAST(CAST(:since AS text) AS xid8)
    """
)

# The runs of a prepared claim that committed late start when it commits, and their
# running leases run from then (on the lease clock; :leased_at is the moment the claim
# took them as of): the body's first renewal is due a third of a lease after it starts.
_RESTAMP_START = text(
    f"""
    WITH runs AS (
        UPDATE scheduler_runs
        SET started_at = CAST(:started AS timestamptz),
            lateness_ms = lateness_ms + CAST(:late_ms AS bigint)
        WHERE id = ANY(CAST(CAST(:run_ids AS text[]) AS bigint[]))
        RETURNING id
    )
    UPDATE scheduler_jobs
    SET last_started_at = CAST(:started AS timestamptz),
        running_since = CAST(:started AS timestamptz),
        running_until = GREATEST(running_until,
            {LEASE_NOW_SQL} + (running_until - CAST(:leased_at AS timestamptz)))
    WHERE running_run_id IN (SELECT id FROM runs)
    """
)
# A run starts only when no other body holds an unexpired running lease on the job.
_STARTS = f"""(c.runs AND (j.running_until IS NULL OR j.running_until <= {LEASE_NOW_SQL}))"""
# The rows of a claim's jobs that no other transaction holds, locked as the claim's
# UPDATE would lock them: the claim updates only these. A row held elsewhere (an
# operator's psql session left open on SELECT ... FOR UPDATE) is skipped, never waited
# on, whatever lock_timeout the database sets (none by default): a wait there would
# hold up every job of the claim, and the timer's every later wake, for as long as the
# row is held. Never waiting, a claim also never deadlocks on job rows.
_LOCK_FREE_ROWS = text(
    "SELECT id FROM scheduler_jobs WHERE schedule = :schedule"
    " AND id = ANY(CAST(:ids AS text[])) FOR NO KEY UPDATE SKIP LOCKED"
)
# Of the jobs a claim could not lock, those that have a row: it is held elsewhere.
_STORED_IDS = text(
    "SELECT id FROM scheduler_jobs WHERE schedule = :schedule AND id = ANY(CAST(:ids AS text[]))"
)
# Every slot and run-now request a wake claims, in ONE conditional UPDATE: each given
# row (c) matches its job only while the job is unpaused, its slot (next_run_at) or
# request (run_requested_at, ``manual``) is still the one given, and (fenced) this
# process's lock connection holds the key. A slot claim moves the job's next slot; a
# run-now claim clears its request. A slot that is not run never overwrites the status
# of a body that still runs; a run that starts clears the last error (an error is an
# outcome's, not the note of the reap the claim made). Arrays travel as text[] (see
# _UPSERT).
_CLAIM = """
    UPDATE scheduler_jobs j
    SET next_run_at = CASE WHEN c.manual THEN j.next_run_at ELSE c.next_slot END,
        run_requested_at = CASE WHEN c.manual THEN NULL ELSE j.run_requested_at END,
        last_started_at = CASE WHEN {starts}
            THEN CAST(:now AS timestamptz) ELSE j.last_started_at END,
        last_status = CASE WHEN {starts} THEN 'running'
            WHEN j.running_until > {lease_now} THEN j.last_status
            WHEN c.runs THEN 'skipped_overlap' ELSE c.status END,
        last_error = CASE WHEN {starts} THEN NULL ELSE j.last_error END,
        running_run_id = CASE WHEN {starts} THEN c.run_id ELSE j.running_run_id END,
        running_since = CASE WHEN {starts}
            THEN CAST(:now AS timestamptz) ELSE j.running_since END,
        running_until = CASE WHEN {starts}
            THEN {lease_now} + make_interval(secs => c.lease_seconds) ELSE j.running_until END,
        running_pid = CASE WHEN {starts} THEN CAST(:pid AS integer) ELSE j.running_pid END,
        running_host = CASE WHEN {starts} THEN CAST(:host AS text) ELSE j.running_host END,
        updated_at = now()
    FROM unnest(CAST(:ids AS text[]), CAST(CAST(:dues AS text[]) AS timestamptz[]),
            CAST(CAST(:next_slots AS text[]) AS timestamptz[]),
            CAST(CAST(:manuals AS text[]) AS boolean[]), CAST(CAST(:runs AS text[]) AS boolean[]),
            CAST(:statuses AS text[]), CAST(CAST(:run_ids AS text[]) AS bigint[]),
            CAST(CAST(:lease_seconds AS text[]) AS double precision[]))
        AS c(id, due, next_slot, manual, runs, status, run_id, lease_seconds)
    WHERE j.schedule = :schedule AND j.id = c.id AND NOT j.paused
        AND CASE WHEN c.manual THEN j.run_requested_at ELSE j.next_run_at END = c.due {fence}
    RETURNING c.id, j.running_run_id IS NOT DISTINCT FROM c.run_id AS started,
        j.next_run_at, j.running_run_id, j.running_until, j.running_pid, j.running_host,
        COALESCE((SELECT term FROM scheduler_leadership WHERE schedule = :schedule), 0) AS term
    """
_FENCE = f"""
      AND EXISTS (
        SELECT 1 FROM pg_locks WHERE {LEADER_KEY_LOCKS_BOUND} AND granted AND pid = :fence_pid)
    """
# fenced -> the claim statement.
_CLAIMS = {
    fenced: text(
        _CLAIM.format(starts=_STARTS, lease_now=LEASE_NOW_SQL, fence=_FENCE if fenced else "")
    )
    for fenced in (False, True)
}
# Run ids for a claim's rows, allocated before its UPDATE (a run's id is its lease token).
# The sequence is looked up once (OFFSET 0 keeps the subquery apart), not per id: a
# lookup per row made a thousand ids cost 11 ms instead of 2.
_NEXT_RUN_IDS = text(
    "SELECT nextval(s.seq) AS id FROM (SELECT CAST(pg_get_serial_sequence("
    "'scheduler_runs', 'id') AS regclass) AS seq OFFSET 0) s,"
    " generate_series(1, CAST(:count AS integer))"
)
# The leader run rows of a claim, in one statement; a slot that already has its run
# keeps it (the row given is left out of RETURNING).
_INSERT_LEADER_RUNS = text(
    """
    INSERT INTO scheduler_runs
        (id, schedule, job_id, scope, slot, manual, started_at, finished_at, status,
         lateness_ms, jitter_ms, pid, host, error)
    SELECT COALESCE(r.id, nextval(pg_get_serial_sequence('scheduler_runs', 'id'))),
        :schedule, r.job_id, 'leader', r.slot, r.manual, CAST(:now AS timestamptz),
        CASE WHEN r.status = 'running' THEN NULL ELSE CAST(:now AS timestamptz) END,
        r.status, r.lateness_ms, r.jitter_ms, :pid, :host, r.error
    FROM unnest(CAST(CAST(:ids AS text[]) AS bigint[]), CAST(:job_ids AS text[]),
            CAST(CAST(:slots AS text[]) AS timestamptz[]),
            CAST(CAST(:manuals AS text[]) AS boolean[]), CAST(:statuses AS text[]),
            CAST(CAST(:lateness_ms AS text[]) AS bigint[]),
            CAST(CAST(:jitter_ms AS text[]) AS bigint[]), CAST(:errors AS text[]))
        WITH ORDINALITY AS r(id, job_id, slot, manual, status, lateness_ms, jitter_ms, error, n)
    ORDER BY r.n
    ON CONFLICT (schedule, job_id, slot, manual) WHERE scope = 'leader' DO NOTHING
    RETURNING id, job_id, slot, manual
    """
)

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

# The run a leader slot already has: it ran (or was recorded) before the schedule came
# back to it (a trigger change, a clock behind the last leader's); for a request, one
# made at the very instant of an earlier one.
_RECORDED_RUN = text(
    "SELECT id, status FROM scheduler_runs WHERE schedule = :schedule AND job_id = :job_id"
    " AND slot = :slot"
    " AND scope = 'leader' AND manual = :manual"
)
_UNDO_START = text(
    """
    UPDATE scheduler_jobs
    SET running_run_id = NULL, running_since = NULL, running_until = NULL,
        running_pid = NULL, running_host = NULL, last_status = :status
    WHERE schedule = :schedule AND id = :job_id AND running_run_id = :run_id
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

# A batch write waits at most this long for a row another transaction holds, then
# fails, and its writer tries each of its rows alone: one job row locked for long (an
# operator's open transaction, a stuck claim) must not hold up every other run.
_ROW_LOCK_PATIENCE = text("SET LOCAL lock_timeout = '1s'")

# The leases of a batch of runs (l): a leader run's is on its job row, a per-worker
# run's on its own run row (a reaped run no longer holds one).
_LEASES = """unnest(CAST(:job_ids AS text[]), CAST(CAST(:run_ids AS text[]) AS bigint[]))
        AS l(job_id, run_id)"""
_RENEW_LEASES = text(
    f"""
    UPDATE scheduler_jobs j SET running_until = {_LEASE_END}
    FROM {_LEASES}
    WHERE j.schedule = :schedule AND j.id = l.job_id AND j.running_run_id = l.run_id
    RETURNING l.run_id
    """
)
_RENEW_REPLICA_LEASES = text(
    f"""
    UPDATE scheduler_runs r SET running_until = {_LEASE_END}
    FROM {_LEASES}
    WHERE r.id = l.run_id AND r.running_until IS NOT NULL
    RETURNING l.run_id
    """
)
# A service copy's lease, on its service's row (s): taken only while no other copy's
# lease holds, and only while this leader's lock connection holds the key; its token is
# a run id. A take that finds the lease held matches nothing.
_TAKE_SERVICE_LEASE = text(
    f"""
    INSERT INTO scheduler_services AS s
        (schedule, id, running_run_id, running_since, running_until, running_pid, running_host)
    SELECT CAST(:schedule AS text), CAST(:service_id AS text),
        nextval(pg_get_serial_sequence('scheduler_runs', 'id')), {LEASE_NOW_SQL}, {_LEASE_END},
        CAST(:pid AS integer), CAST(:host AS text)
    WHERE EXISTS (
        SELECT 1 FROM pg_locks WHERE {LEADER_KEY_LOCKS_BOUND} AND granted AND pid = :fence_pid)
    ON CONFLICT (schedule, id) DO UPDATE
    SET running_run_id = excluded.running_run_id, running_since = excluded.running_since,
        running_until = excluded.running_until, running_pid = excluded.running_pid,
        running_host = excluded.running_host
    WHERE s.running_until IS NULL OR s.running_until <= {LEASE_NOW_SQL}
    RETURNING s.running_run_id
    """
)
# Who holds a service's lease, and for how many more seconds on the lease clock.
_SERVICE_HOLDER = text(
    f"""
    SELECT running_pid, running_host,
        EXTRACT(epoch FROM running_until - {LEASE_NOW_SQL}) AS left_seconds
    FROM scheduler_services
    WHERE schedule = :schedule AND id = :service_id AND running_until > {LEASE_NOW_SQL}
    """
)
_RENEW_SERVICE_LEASES = text(
    f"""
    UPDATE scheduler_services s SET running_until = {_LEASE_END}
    FROM {_LEASES}
    WHERE s.schedule = :schedule AND s.id = l.job_id AND s.running_run_id = l.run_id
    RETURNING l.run_id
    """
)
# Released by its token; the NOTIFY (sent at commit) wakes a leader waiting to start
# the next copy.
_RELEASE_SERVICE_LEASE = text(
    f"""
    WITH released AS (
        UPDATE scheduler_services
        SET running_run_id = NULL, running_since = NULL, running_until = NULL,
            running_pid = NULL, running_host = NULL
        WHERE schedule = :schedule AND id = :service_id AND running_run_id = :run_id
        RETURNING id)
    SELECT pg_notify('{WAKE_CHANNEL}', id) FROM released
    """
)
# Every lease kind's renewal, by the row that holds the lease.
_RENEWALS = {
    "job": _RENEW_LEASES,
    "run": _RENEW_REPLICA_LEASES,
    "service": _RENEW_SERVICE_LEASES,
}

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

# The runs whose lease the reaping process renews itself (JobStore.renewing), as text[]
# (see _UPSERT): their bodies run in that process, so a lease of theirs that ran out
# only says the process froze past it, and its renewal is on its way.
_RENEWING = "CAST(CAST(:renewing AS text[]) AS bigint[])"

# A lease that ran out: its owner died (or froze past it). Its run, if still recorded
# as running, and the job's running status become 'abandoned'; the lease is cleared.
# Never a lease the reaping process renews itself.
_REAP = text(
    f"""
    WITH expired AS (
        SELECT id, running_run_id,
            format('abandoned: the process that ran it (pid %s on %s) stopped renewing its '
                   'running lease, which ran out at %s', running_pid, running_host,
                   running_until) AS note
        FROM scheduler_jobs
        WHERE schedule = :schedule AND running_until <= {LEASE_NOW_SQL}
            AND (CAST(:job_ids AS text[]) IS NULL OR id = ANY(CAST(:job_ids AS text[])))
            AND running_run_id <> ALL({_RENEWING})
        FOR UPDATE SKIP LOCKED
    ), abandoned_runs AS (
        UPDATE scheduler_runs r
        SET status = 'abandoned', finished_at = CAST(:now AS timestamptz), error = e.note
        FROM expired e
        WHERE r.id = e.running_run_id AND r.status = 'running'
    )
    UPDATE scheduler_jobs j
    SET last_status = CASE WHEN j.last_status = 'running' THEN 'abandoned' ELSE j.last_status END,
        last_finished_at = CASE WHEN j.last_status = 'running'
            THEN CAST(:now AS timestamptz) ELSE j.last_finished_at END,
        last_error = CASE WHEN j.last_status = 'running' THEN e.note ELSE j.last_error END,
        running_run_id = NULL, running_since = NULL, running_until = NULL,
        running_pid = NULL, running_host = NULL, updated_at = now()
    FROM expired e
    WHERE j.schedule = :schedule AND j.id = e.id
    RETURNING j.id
    """
)

# The per-worker runs whose own lease ran out: their worker died (or froze past it).
# A run still recorded as running becomes 'abandoned', and so does the job's last
# status while it still says 'running' (no outcome was recorded since the last start,
# and no leader run of it holds the job's lease); every expired lease is cleared.
# Statuses decide, never times: a finish is stamped on its worker's own clock, which
# cannot be compared with a lease's end on the lease clock.
_REAP_REPLICA_RUNS = text(
    f"""
    WITH expired AS (
        SELECT id, job_id, status AS was, running_until AS lapsed_at,
            format('abandoned: the worker that ran it (pid %s on %s) stopped renewing its '
                   'running lease, which ran out at %s', pid, host, running_until) AS note
        FROM scheduler_runs
        WHERE schedule = :schedule AND running_until <= {LEASE_NOW_SQL} AND scope = 'replica'
            AND (CAST(:job_id AS text) IS NULL OR job_id = CAST(:job_id AS text))
            AND id <> ALL({_RENEWING})
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


@dataclass(frozen=True)
class ClaimedSlot:
    """A slot claim that matched: its run row, and 'running', 'missed',
    'skipped_overlap' (a run refused because another body holds the running lease) or
    'already_recorded' (the slot has its run already: the job moved on, nothing runs).
    ``term``: the leadership term the claim saw (0 before any leader was recorded).
    ``next_slot``: the job's next slot as the claim left it (a request leaves it)."""

    run_id: int
    status: str
    term: int
    next_slot: datetime
    error: str | None = None


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


# Where a running lease is held: on a job's row (a leader run), on a run's own row (a
# per-worker run), on a service's row (a service copy).
LeaseKind = Literal["job", "run", "service"]


@dataclass(frozen=True)
class HeldLease:
    """A running lease a run of this process holds, by its token ``run_id`` (a run id),
    on the row ``kind`` names: ``job_id``'s row for a leader run (``job``), the run's
    own row for a per-worker run (``run``), the row of the service ``job_id`` for a
    service copy (``service``)."""

    job_id: str
    run_id: int
    kind: LeaseKind = "job"


@dataclass(frozen=True)
class ServiceTake:
    """The answer to a take of a service's running lease: ``run_id``, the new copy's
    token, when taken; else the copy that holds it (``pid`` on ``host``, None when
    none does: this leader no longer holds the key) and the seconds ``left`` on its
    lease, on the lease clock."""

    run_id: int | None
    pid: int | None = None
    host: str | None = None
    left: float = 0.0


@dataclass(frozen=True)
class ReapedRun:
    """A per-worker run reaped to 'abandoned': its worker (``pid`` on ``host``)
    stopped renewing its running lease."""

    job_id: str
    run_id: int
    pid: int
    host: str


@dataclass(frozen=True)
class LeaderJobs:
    """The live leader of a schedule (process ``pid`` on ``host``) and the ids of the
    leader-only jobs and of the services it recorded at its promotion; ``service_ids``
    is None for a leader of a release that did not record them."""

    pid: int
    host: str
    job_ids: frozenset[str]
    service_ids: frozenset[str] | None


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


@dataclass(frozen=True)
class JobRow:
    """A job's schedule state as the database holds it. ``run_requested_at``: when an
    operator asked to run it now (None: no request pending). ``leader_only``: False once
    the newest registration of the job is a per-worker one's (a release that made it
    per-worker runs beside this one): no leader fires it then. ``running_until``: the end
    of the running lease of a run of it as read (None: none). A renewal or a release
    does not mark the row changed, so it may be stale: only a hint, never a decision."""

    next_run_at: datetime
    paused: bool
    run_requested_at: datetime | None = None
    leader_only: bool = True
    running_until: datetime | None = None

    @classmethod
    def read(
        cls,
        next_run_at: datetime,
        paused: bool,
        run_requested_at: datetime | None,
        leader_only: bool = True,
        running_until: datetime | None = None,
    ) -> JobRow:
        """The row as the database gave it, its moments aware: asyncpg gives
        PostgreSQL's 'infinity' and '-infinity' (an operator's "never") as the naive
        datetime.max and datetime.min, which no aware moment can be compared with."""
        return cls(
            _aware(next_run_at),
            paused,
            _aware_or_none(run_requested_at),
            leader_only,
            _aware_or_none(running_until),
        )

    @classmethod
    def of(cls, row: Any) -> JobRow:
        """read() of a result row that has the columns of the same names."""
        return cls.read(
            row.next_run_at, row.paused, row.run_requested_at, row.leader_only, row.running_until
        )


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _aware_or_none(moment: datetime | None) -> datetime | None:
    return None if moment is None else _aware(moment)


@dataclass(frozen=True)
class StoredJob:
    """A job's row as a promotion finds it: what registration compares (name, trigger,
    leader_only) and its schedule state."""

    name: str
    trigger: str
    leader_only: bool
    row: JobRow


@dataclass(frozen=True)
class StoredJobs:
    """Every job row of a schedule, its broken marks, and the ``horizon`` to read the
    changes made since from (JobStore.changed_rows)."""

    horizon: str
    jobs: dict[str, StoredJob]
    broken: frozenset[str]


@dataclass(frozen=True)
class ChangedRows:
    """The job rows changed since a horizon, and the horizon to read the next changes
    from."""

    horizon: str
    rows: dict[str, JobRow]


@dataclass(frozen=True)
class SlotClaim:
    """One job's claim in a JobStore.claim_many(): its slot ``due`` (next_run_at), or
    with ``manual`` its run-now request made at ``due`` (run_requested_at).

    ``run_slot``: the slot of the run row (a late slot coalesces into the latest; a
    request's is the request time). ``next_slot``: where a slot claim moves next_run_at
    (None for a request, which leaves it). ``status``: 'running' for a run, which takes
    the running lease for ``lease_seconds``; 'missed' or 'skipped_overlap' for a slot
    claimed but not run. ``missed_before`` (slot, note) adds a 'missed' row for the
    slots an outage passed over before this one. ``jitter`` (seconds) is recorded
    apart: lateness counts from ``run_slot`` + ``jitter``.
    """

    job_id: str
    due: datetime
    run_slot: datetime
    next_slot: datetime | None
    status: str
    lease_seconds: float | None = None
    error: str | None = None
    missed_before: tuple[datetime, str] | None = None
    jitter: float = 0.0

    @classmethod
    def request(
        cls,
        job_id: str,
        requested_at: datetime,
        *,
        status: str,
        lease_seconds: float | None = None,
        error: str | None = None,
    ) -> SlotClaim:
        """The claim of the run-now request made at ``requested_at``."""
        return cls(job_id, requested_at, requested_at, None, status, lease_seconds, error)

    @property
    def manual(self) -> bool:
        """True for a run-now request."""
        return self.next_slot is None

    @property
    def runs(self) -> bool:
        """True when the claim starts a run (it asks for the running lease)."""
        return self.status == "running"


class PreparedClaimDropped(Exception):
    """A prepared claim was rolled back before its commit: the leadership it was made
    for ended while it waited. It claimed nothing; the next leader claims its slots."""


@dataclass(frozen=True)
class PreparedCommit:
    """When a prepared claim commits: its statements run at once, then its transaction
    stays open until ``wait()`` returns (the slot), and commits; an exception from
    ``wait()`` (a cancel, a lost leadership) rolls it back, claiming nothing.

    ``starts_at``: the instant the bodies are meant to start, written as the runs'
    start (``now()`` gives the clock, read before each write, so that a preparation
    that outlasts its lead records when the runs really start). ``seconds``: about how
    long the transaction waits: the server ends its session when it idles in the
    transaction a second longer (a frozen process must not hold job rows for good).
    """

    starts_at: datetime
    wait: Callable[[], Awaitable[None]]
    now: Callable[[], datetime]
    seconds: float

    def start(self) -> datetime:
        """The runs' start as of now: the planned instant, or later if it passed."""
        return max(self.starts_at, self.now())


@dataclass(frozen=True)
class _Recording:
    """What a claim's UPDATE gave one job, for its run row."""

    status: str
    error: str | None
    run_id: int | None
    term: int
    next_slot: datetime


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _text(value: float | None) -> str | None:
    return None if value is None else str(value)


def _lateness_ms(now: datetime, slot: datetime, jitter: float) -> int:
    """Milliseconds from the slot plus its jitter to ``now``; never below zero."""
    return max(0, int((now - slot - timedelta(seconds=jitter)).total_seconds() * 1000))


def format_error(exc: BaseException, limit: int = 8000) -> str:
    """The exception with its traceback, cut to ``limit`` characters for the run row,
    and always storable: a NUL or a lone surrogate (text a body quoted from raw bytes)
    is escaped, since PostgreSQL refuses it and the whole outcome would be lost."""
    return escape_unstorable(("".join(traceback.format_exception(exc)))[-limit:])


class JobStore:
    """Reads and writes scheduler_jobs and scheduler_runs for one process, for the
    schedule named ``schedule``: every statement is bound to it, so the rows of another
    schedule in the same database are never read or written.

    ``lease_clock``: the clock running leases are written and compared on (see
    clock.lease_clock); None, the database server's. Leases are given as lengths in
    seconds, never as instants of this process's clock."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        pid: int,
        host: str,
        lease_clock: Clock | None = None,
        schedule: str = DEFAULT_SCHEDULE,
    ) -> None:
        # Read committed whatever the database or role defaults to: under repeatable
        # read an outcome write that meets a concurrent update of the job row (a lease
        # renewal, a pause, another leader's claim) fails, and the outcome is lost.
        self.engine = engine.execution_options(isolation_level="READ COMMITTED")
        self.pid = pid
        self.host = host
        self.lease_clock = lease_clock
        self.key = LeaderKey.of(schedule)
        self.schedule = schedule
        # The run ids whose running lease this process renews, kept by its Runner: no
        # reap of this store takes them, whatever the lease clock says.
        self.renewing: set[int] = set()

    def _reap_params(
        self, now: datetime, job_id: str | None = None, job_ids: list[str] | None = None
    ) -> dict[str, object]:
        return {
            "now": now,
            "job_id": job_id,
            "job_ids": job_ids,
            "schedule": self.schedule,
            "renewing": [str(run_id) for run_id in sorted(self.renewing)],
        } | self._lease_now(now)

    def _lease_now(self, now: datetime | None = None) -> dict[str, object]:
        # On a test's clock, the caller's ``now`` (read before any wait) is the lease's.
        if self.lease_clock is None:
            return {"lease_now": None}
        return {"lease_now": now if now is not None else self.lease_clock.now()}

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

    async def stored_jobs(self) -> StoredJobs:
        """Every job row of this schedule, its broken marks, and the horizon from which
        changed_rows() reads what changed after (or while) they were read."""
        params = {"schedule": self.schedule}
        async with self.engine.connect() as conn:
            horizon, broken = (await conn.execute(_PROMOTION_HORIZON, params)).one()
            result = await conn.execute(_STORED_JOBS, params)
            jobs = {
                row.id: StoredJob(
                    row.name,
                    row.trigger,
                    row.leader_only,
                    JobRow.of(row),
                )
                for row in result
            }
        return StoredJobs(horizon, jobs, frozenset(broken))

    async def analyze(self) -> None:
        """Refresh the planner's statistics of the job table (ANALYZE). A role that does
        not own the table gets a warning from the server and nothing is done."""
        async with self.engine.begin() as conn:
            await conn.execute(_ANALYZE_JOBS)

    async def changed_rows(self, since: str) -> ChangedRows:
        """The job rows of this schedule changed by any transaction that the read whose
        horizon is ``since`` could not see, and the horizon to read from next; the same
        horizon when no row changed. A row may come again unchanged (a change committed
        around a read), and a transaction held open elsewhere holds horizons back, so
        the rows changed since it began come each time: never fewer than what changed."""
        async with self.engine.connect() as conn:
            params = {"since": since, "schedule": self.schedule}
            fetched = (await conn.execute(_CHANGED_JOBS, params)).all()
        rows = {
            job_id: JobRow.read(next_run_at, paused, request, leader_only, running_until)
            for _, job_id, next_run_at, paused, request, leader_only, running_until in fetched
        }
        return ChangedRows(fetched[0].horizon if fetched else since, rows)

    async def upsert_leader_rows(self, rows: Sequence[LeaderRow]) -> dict[str, JobRow]:
        """Write ``rows`` (see register_leader_jobs) in one statement and one commit;
        return each job's stored next slot and pause flag. A row without slots whose job
        has no row or another trigger by now is left out: register it with its slots.
        So is a row another transaction holds, never waited on, as in a claim."""
        if not rows:
            return {}
        async with self.engine.begin() as conn:
            await conn.execute(_OWN_INSERTS)
            held = await self._lock_free_rows(conn, [row.id for row in rows])
            rows = [row for row in rows if row.id not in held]
            if not rows:
                return {}
            return await self._upsert(conn, rows)

    async def _upsert(self, conn: AsyncConnection, rows: Sequence[LeaderRow]) -> dict[str, JobRow]:
        params = {
            "ids": [row.id for row in rows],
            "names": [row.name for row in rows],
            "triggers": [row.trigger for row in rows],
            "first_slots": [_iso(row.first_slot) for row in rows],
            "reset_slots": [_iso(row.reset_slot) for row in rows],
            "schedule": self.schedule,
        }
        result = await conn.execute(_UPSERT, params)
        return {
            row.id: JobRow.read(
                row.next_run_at, row.paused, row.run_requested_at, True, row.running_until
            )
            for row in result
        }

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

    async def reap(self, now: datetime) -> list[str]:
        """Reap every running lease that ran out (on the lease clock), a leader run's on the job
        row and a per-worker run's on its run row (see the module docstring); return the
        ids of the jobs reaped, once per run. A lease this process renews itself
        (``renewing``) is never reaped: its body runs here."""
        async with self.engine.begin() as conn:
            params = self._reap_params(now)
            reaped = [row.id for row in await conn.execute(_REAP, params)]
            replicas = await conn.execute(_REAP_REPLICA_RUNS, params)
            return reaped + [row.job_id for row in replicas]

    async def server_now(self) -> datetime:
        """The database server's clock (``clock_timestamp()``), read in one round trip;
        raises what the database raises."""
        async with self.engine.connect() as conn:
            now: datetime = (await conn.execute(_SERVER_NOW)).scalar_one()
        return now

    async def heartbeat(self, backend_pid: int, now: datetime) -> None:
        """Note that the leader on lock backend ``backend_pid`` still fires, at ``now``
        as the lease clock reads it (the database server's, see clock.lease_clock)."""
        params = {"backend_pid": backend_pid, "schedule": self.schedule} | self._lease_now(now)
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

    async def load(self, job_ids: Iterable[str]) -> dict[str, JobRow]:
        """The stored next slot, pause flag, run-now request and leader_only of each job."""
        async with self.engine.connect() as conn:
            result = await conn.execute(_LOAD, {"ids": list(job_ids), "schedule": self.schedule})
            return {row.id: JobRow.of(row) for row in result}

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
        lease_seconds: float | None = None,
        error: str | None = None,
        missed_before: tuple[datetime, str] | None = None,
        jitter: float = 0.0,
    ) -> ClaimedSlot | None:
        """Claim slot ``due`` and record its run row, in one commit: claim_many() of
        one slot (see SlotClaim for the arguments). Returns the run row and the status
        it got, or None when the claim matched nothing: another process took the slot,
        the job is paused, or (fenced) this process no longer holds the leader key.
        Raises JobRowBusyError when another transaction holds the job's row.
        """
        item = SlotClaim(
            spec.id,
            due=due,
            run_slot=run_slot,
            next_slot=next_slot,
            status=status,
            lease_seconds=lease_seconds,
            error=error,
            missed_before=missed_before,
            jitter=jitter,
        )
        return _only(await self.claim_many([item], now=now, fence_pid=fence_pid))

    async def claim_request(
        self,
        spec: JobSpec,
        *,
        requested_at: datetime,
        now: datetime,
        status: str,
        fence_pid: int | None,
        lease_seconds: float | None = None,
        error: str | None = None,
    ) -> ClaimedSlot | None:
        """Claim the run-now request made at ``requested_at`` and record its manual run,
        whose slot is the request time, in one commit; the job's next slot is left alone.

        ``status``, ``lease_seconds`` and the running lease are as in claim(); nothing
        coalesces and no jitter applies, since the run fires at once. Returns None when
        the claim matched nothing: another process took the request, the job is paused,
        or (fenced) this process no longer holds the leader key. Raises JobRowBusyError
        when another transaction holds the job's row.
        """
        item = SlotClaim.request(
            spec.id, requested_at, status=status, lease_seconds=lease_seconds, error=error
        )
        return _only(await self.claim_many([item], now=now, fence_pid=fence_pid))

    async def claim_many(
        self,
        items: Sequence[SlotClaim],
        *,
        now: datetime,
        fence_pid: int | None,
        prepared: PreparedCommit | None = None,
    ) -> list[ClaimedSlot | JobRowBusyError | None]:
        """Claim every slot and run-now request in ``items`` (one per job) and record
        their run rows, in one commit and a fixed number of statements however many
        there are: one lock of their rows, one reap of their lapsed leases, one
        allocation of run ids, ONE conditional UPDATE that claims them all, one insert
        of the run rows.

        A job whose row another transaction holds is left out at once, never waited
        for (JobRowBusyError in its place): the others are claimed as if it were not
        given, whatever timeouts the database sets.

        Each item is claimed exactly as it would be alone: it matches only while its job
        is unpaused, its slot or request is still the one given and (``fence_pid``) this
        process's lock connection holds the key. An item whose status is 'running' takes
        the job's running lease for its ``lease_seconds``, or is recorded
        'skipped_overlap' while another body holds an unexpired one (a lease that ran
        out is reaped first). A slot that already has its run is 'already_recorded'
        and runs nothing, but the job moves on. Returns, in the order of ``items``,
        each one's run row and status, or None where the claim matched nothing.

        ``prepared``: commit when its ``wait()`` returns rather than at once (``now``
        is then its ``starts_at``); what ``wait()`` raises rolls the claim back and
        propagates. A fenced prepared claim checks its fence again before it commits
        and raises PreparedClaimDropped (rolled back) when the key is gone.
        """
        if not items:
            return []
        ids = [item.job_id for item in items]
        assert len(set(ids)) == len(ids), "one claim per job at a time"
        assert all(item.status != "running" or item.lease_seconds is not None for item in items), (
            "a run needs the length of its lease"
        )
        # Rows in id order: two claims of overlapping jobs lock them in the same order.
        order = sorted(range(len(items)), key=lambda index: ids[index])
        ordered = [items[index] for index in order]
        async with self.engine.begin() as conn:
            lease_now = self._lease_now(now)
            if prepared is not None:
                now = prepared.start()
                # Leases are reaped, compared and taken as of the start the claim waits
                # for: on the server's clock, its moment as far ahead of the server's
                # now as the start is ahead of ours.
                lead = max(0.0, (now - prepared.now()).total_seconds())
                idle_ms = int((prepared.seconds + _PREPARED_IDLE_SLACK) * 1000)
                at_start = (
                    (await conn.execute(_PREPARE, {"ms": str(idle_ms), "lead": lead}))
                    .one()
                    .at_start
                )
                lease_now = self._lease_now(now) if self.lease_clock else {"lease_now": at_start}
            busy = await self._lock_free_rows(conn, ids)
            ordered = [item for item in ordered if item.job_id not in busy]
            if not ordered:
                return [busy.get(job_id) for job_id in ids]
            runs = [item.job_id for item in ordered if item.runs]
            if runs:
                await conn.execute(_REAP, self._reap_params(now, job_ids=runs) | lease_now)
            # History reads in id order: a job's passed-over slots get the lower id,
            # though the claim allocates the run's id (its lease token) first.
            wanted = sum(item.runs + (item.missed_before is not None) for item in ordered)
            allocated = []
            if wanted:
                allocated = [row.id for row in await conn.execute(_NEXT_RUN_IDS, {"count": wanted})]
            fresh = iter(sorted(allocated))
            missed_ids = {
                item.job_id: next(fresh) for item in ordered if item.missed_before is not None
            }
            run_ids = {item.job_id: next(fresh) for item in ordered if item.runs}
            params: dict[str, object] = {
                "ids": [item.job_id for item in ordered],
                "dues": [_iso(item.due) for item in ordered],
                "next_slots": [_iso(item.next_slot) for item in ordered],
                "manuals": [_flag(item.manual) for item in ordered],
                "runs": [_flag(item.runs) for item in ordered],
                "statuses": [item.status for item in ordered],
                "run_ids": [_text(run_ids.get(item.job_id)) for item in ordered],
                "lease_seconds": [_text(item.lease_seconds) for item in ordered],
                "now": now,
                "pid": self.pid,
                "host": self.host,
                "schedule": self.schedule,
            } | lease_now
            if fence_pid is not None:
                params |= {"fence_pid": fence_pid} | self.key.bind_params
            claimed = {
                row.id: row for row in await conn.execute(_CLAIMS[fence_pid is not None], params)
            }
            if not claimed:
                return [busy.get(job_id) for job_id in ids]
            if prepared is not None:
                now = prepared.start()
            recorded: dict[str, _Recording] = {}
            rows: list[tuple[int | None, str, datetime, bool, str, int, int, str | None]] = []
            for item in ordered:
                row = claimed.get(item.job_id)
                if row is None:
                    continue
                status, error = item.status, item.error
                if item.runs and not row.started:
                    status = "skipped_overlap"
                    error = (
                        f"run {row.running_run_id} was still going on "
                        f"{row.running_host} (pid {row.running_pid}); its running lease "
                        f"lasts until {row.running_until.isoformat()}"
                    )
                run_id = run_ids.get(item.job_id) if status == "running" else None
                recorded[item.job_id] = _Recording(status, error, run_id, row.term, row.next_run_at)
                if item.missed_before is not None:
                    # A passed-over slot that is already in the history stays as recorded.
                    missed_slot, note = item.missed_before
                    missed = (missed_ids[item.job_id], item.job_id, missed_slot, False)
                    rows.append((*missed, "missed", _lateness_ms(now, missed_slot, 0.0), 0, note))
                fire = _lateness_ms(now, item.run_slot, item.jitter)
                jitter_ms = int(item.jitter * 1000)
                rows.append(
                    (
                        run_id,
                        item.job_id,
                        item.run_slot,
                        item.manual,
                        status,
                        fire,
                        jitter_ms,
                        error,
                    )
                )
            inserted = {
                (row.job_id, row.slot, row.manual): row.id
                for row in await conn.execute(
                    _INSERT_LEADER_RUNS,
                    {
                        "ids": [_text(row[0]) for row in rows],
                        "job_ids": [row[1] for row in rows],
                        "slots": [_iso(row[2]) for row in rows],
                        "manuals": [_flag(row[3]) for row in rows],
                        "statuses": [row[4] for row in rows],
                        "lateness_ms": [str(row[5]) for row in rows],
                        "jitter_ms": [str(row[6]) for row in rows],
                        "errors": [row[7] for row in rows],
                        "now": now,
                        "pid": self.pid,
                        "host": self.host,
                        "schedule": self.schedule,
                    },
                )
            }
            results: dict[str, ClaimedSlot] = {}
            for item in ordered:
                got = recorded.get(item.job_id)
                if got is None:
                    continue
                run_row = inserted.get((item.job_id, item.run_slot, item.manual))
                if run_row is not None:
                    results[item.job_id] = ClaimedSlot(
                        run_row, got.status, got.term, got.next_slot, got.error
                    )
                    continue
                results[item.job_id] = await self._already_recorded(conn, item, got)
            if prepared is not None:
                await prepared.wait()
                if fence_pid is not None and not await self._still_fenced(conn, fence_pid):
                    # The key was lost while the claim waited: roll it back.
                    raise PreparedClaimDropped
                started = prepared.now()
                if started > now:
                    # The commit comes late (a busy loop, a slow preparation): the runs
                    # start now, not when their rows said, and hold a whole lease from now.
                    leased_at = lease_now["lease_now"]
                    await self._restamp(conn, results.values(), now, started, leased_at)
        return [results[job_id] if job_id in results else busy.get(job_id) for job_id in ids]

    async def _lock_free_rows(
        self, conn: AsyncConnection, ids: list[str]
    ) -> dict[str, JobRowBusyError]:
        """Lock the rows of ``ids`` that no other transaction holds, without waiting;
        return the error of each job whose row is held elsewhere (a job with no row is
        not busy: its claim matches nothing)."""
        params = {"ids": ids, "schedule": self.schedule}
        free = {row.id for row in await conn.execute(_LOCK_FREE_ROWS, params)}
        left_out = [job_id for job_id in ids if job_id not in free]
        if not left_out:
            return {}
        held = await conn.execute(_STORED_IDS, params | {"ids": left_out})
        return {row.id: JobRowBusyError(row.id) for row in held}

    async def _still_fenced(self, conn: AsyncConnection, fence_pid: int) -> bool:
        held = await conn.execute(_STILL_FENCED, {"fence_pid": fence_pid} | self.key.bind_params)
        return bool(held.scalar_one())

    async def _restamp(
        self,
        conn: AsyncConnection,
        claimed: Iterable[ClaimedSlot],
        was: datetime,
        started: datetime,
        leased_at: object,
    ) -> None:
        run_ids = [str(slot.run_id) for slot in claimed if slot.status == "running"]
        if run_ids:
            await conn.execute(
                _RESTAMP_START,
                {
                    "run_ids": run_ids,
                    "started": started,
                    "late_ms": int((started - was).total_seconds() * 1000),
                    "leased_at": leased_at,
                }
                | self._lease_now(started),
            )

    async def _already_recorded(
        self, conn: AsyncConnection, item: SlotClaim, got: _Recording
    ) -> ClaimedSlot:
        """The slot already has its run: never run it again, but let the job move on (the
        claim moved next_run_at; a history row never blocks a claim). A start the claim
        made is undone. Rare (a trigger change, a clock behind the last leader's), so
        one statement per such slot."""
        recorded = (
            await conn.execute(
                _RECORDED_RUN,
                {
                    "job_id": item.job_id,
                    "slot": item.run_slot,
                    "manual": item.manual,
                    "schedule": self.schedule,
                },
            )
        ).one()
        if got.run_id is not None:
            await conn.execute(
                _UNDO_START,
                {
                    "job_id": item.job_id,
                    "run_id": got.run_id,
                    "status": recorded.status,
                    "schedule": self.schedule,
                },
            )
        return ClaimedSlot(
            recorded.id,
            "already_recorded",
            got.term,
            got.next_slot,
            f"slot {item.run_slot.isoformat()} already has run {recorded.id} ({recorded.status})",
        )

    async def renew_leases(self, leases: Sequence[HeldLease], lease_seconds: float) -> set[int]:
        """Renew the running lease of every run in ``leases`` for ``lease_seconds``, in
        one commit of at most one statement per kind however many there are (leader
        runs' leases are on their job rows, per-worker runs' on their own run rows,
        service copies' on their services' rows). Returns the tokens of the leases still
        held; a lease left out was lost (it ran out and another run took the job or the
        service, or the run was reaped). Raises what the database raises, after at most
        a second's wait for a row another transaction holds; nothing is renewed then."""
        params: dict[str, object] = {
            "lease_seconds": lease_seconds,
            "schedule": self.schedule,
        } | self._lease_now()
        renewed: set[int] = set()
        # Rows in job id order, as claims lock them: a renewal never deadlocks with one.
        leases = sorted(leases, key=lambda lease: (lease.job_id, lease.run_id))
        async with self.engine.begin() as conn:
            await conn.execute(_ROW_LOCK_PATIENCE)
            for kind, statement in _RENEWALS.items():
                batch = [lease for lease in leases if lease.kind == kind]
                if batch:
                    rows = await conn.execute(statement, params | _lease_arrays(batch))
                    renewed.update(row.run_id for row in rows)
        return renewed

    async def release_lease(self, outcome: Outcome, *, replica: bool = False) -> None:
        """Clear the running lease of ``outcome``'s run (``replica``: its run row's own),
        if it still holds it, as the body whose outcome was recorded before it ended (a
        thread past its timeout) ends. That outcome is recorded again, as finish_many()
        does, where its first record did not land, so the run is never left 'running'
        without a lease."""
        params = _outcome_arrays(self.schedule, [outcome], _lease_reading(self.lease_clock))
        async with self.engine.begin() as conn:
            settled = list(await conn.execute(_SETTLE_RUNS, params))
            if settled:
                await conn.execute(_FINISH_JOBS, params | _runs_before(settled))
            await conn.execute(_RELEASE_REPLICA_LEASES if replica else _RELEASE_LEASES, params)

    async def take_service_lease(
        self, service_id: str, lease_seconds: float, fence_pid: int
    ) -> ServiceTake:
        """Take the running lease of service ``service_id`` for a copy about to start,
        for ``lease_seconds``, in one commit: only while no other copy's lease holds and
        the lock connection of backend ``fence_pid`` holds this schedule's key. Says who
        holds it when it is not taken."""
        params = (
            {
                "schedule": self.schedule,
                "service_id": service_id,
                "lease_seconds": lease_seconds,
                "pid": self.pid,
                "host": self.host,
                "fence_pid": fence_pid,
            }
            | self.key.bind_params
            | self._lease_now()
        )
        async with self.engine.begin() as conn:
            taken = (await conn.execute(_TAKE_SERVICE_LEASE, params)).scalar_one_or_none()
            if taken is not None:
                return ServiceTake(int(taken))
            holder = (await conn.execute(_SERVICE_HOLDER, params)).first()
        if holder is None:
            return ServiceTake(None)
        return ServiceTake(
            None, holder.running_pid, holder.running_host, float(holder.left_seconds)
        )

    async def release_service_lease(self, lease: HeldLease) -> None:
        """Release service copy ``lease`` if it still holds it, as the copy's task and
        every thread it started ended; a leader waiting to start the service is woken."""
        async with self.engine.begin() as conn:
            await conn.execute(_RELEASE_SERVICE_LEASE, _service_lease_params(self.schedule, lease))

    async def start_replica_run(
        self,
        spec: JobSpec,
        slot: datetime,
        now: datetime,
        *,
        lease_seconds: float,
        jitter: float = 0.0,
    ) -> tuple[int, list[ReapedRun]]:
        """Record the start of a per-replica run (no claim: every worker runs it), with
        its own running lease for ``lease_seconds``; lateness counts from ``slot`` +
        ``jitter`` seconds. The job's runs whose lease ran out are reaped
        first, so they are reaped while any worker runs the job, leader or not. Returns
        the new run's id and the runs reaped."""
        async with self.engine.begin() as conn:
            reaped = [
                ReapedRun(row.job_id, row.run_id, row.pid, row.host)
                for row in await conn.execute(_REAP_REPLICA_RUNS, self._reap_params(now, spec.id))
            ]
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
        assert len({outcome.job_id for outcome in outcomes}) == len(outcomes), (
            "one outcome per job in a batch"
        )
        if not outcomes:
            return
        # Job rows in id order, as claims lock them: a batch never deadlocks with one.
        outcomes = sorted(outcomes, key=lambda outcome: outcome.job_id)
        params = _outcome_arrays(self.schedule, outcomes, _lease_reading(self.lease_clock))
        async with self.engine.begin() as conn:
            await conn.execute(_ROW_LOCK_PATIENCE)
            before = list(await conn.execute(_FINISH_RUNS, params))
            await conn.execute(_FINISH_JOBS, params | _runs_before(before))
            if any(outcome.body_ended for outcome in outcomes):
                await conn.execute(_RELEASE_LEASES, params)

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
            "lateness_ms": _lateness_ms(now, slot, jitter),
            "jitter_ms": int(jitter * 1000),
            "pid": self.pid,
            "host": self.host,
            "error": error,
            "lease_seconds": None,
        } | self._lease_now(now)


class ThreadStore:
    """JobStore's lease and outcome writes on the sync engine, callable from any thread:
    for a body's thread and its lease keeper once the event loop is gone."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        schedule: str = DEFAULT_SCHEDULE,
        *,
        lease_clock: Clock | None = None,
    ) -> None:
        self.sessions = sessions
        self.schedule = schedule
        self.lease_clock = lease_clock

    def renew_lease(self, lease: HeldLease, lease_seconds: float) -> bool:
        """JobStore.renew_leases of one lease: False when it is no longer held."""
        params = {
            "lease_seconds": lease_seconds,
            "lease_now": _lease_reading(self.lease_clock),
            "schedule": self.schedule,
        } | _lease_arrays([lease])
        with self.sessions.begin() as session:
            renewed = _read_committed(session).execute(_RENEWALS[lease.kind], params)
            return renewed.first() is not None

    def release_service_lease(self, lease: HeldLease) -> None:
        """JobStore.release_service_lease, from a thread."""
        with self.sessions.begin() as session:
            _read_committed(session).execute(
                _RELEASE_SERVICE_LEASE, _service_lease_params(self.schedule, lease)
            )

    def finish(self, outcome: Outcome) -> None:
        """JobStore.finish_many of one body that ended: record it, clear the lease."""
        params = _outcome_arrays(self.schedule, [outcome], _lease_reading(self.lease_clock))
        with self.sessions.begin() as session:
            conn = _read_committed(session)
            before = list(conn.execute(_FINISH_RUNS, params))
            conn.execute(_FINISH_JOBS, params | _runs_before(before))
            conn.execute(_RELEASE_LEASES, params)


def _only(claims: list[ClaimedSlot | JobRowBusyError | None]) -> ClaimedSlot | None:
    """The answer of a one-item claim_many(); raises its JobRowBusyError."""
    (claim,) = claims
    if isinstance(claim, JobRowBusyError):
        raise claim
    return claim


def _read_committed(session: Session) -> Connection:
    # As JobStore's engine: under repeatable read a write that meets a concurrent update
    # of the job row fails, and the outcome is lost.
    return session.connection(execution_options={"isolation_level": "READ COMMITTED"})


def _lease_reading(lease_clock: Clock | None) -> datetime | None:
    # The :lease_now of a statement: a test's lease clock now, None for the server's.
    return None if lease_clock is None else lease_clock.now()


def _runs_before(rows: Sequence[Any]) -> dict[str, object]:
    # What _FINISH_JOBS reads of each run as its outcome came: its status then, its scope.
    return {
        "before_ids": [str(row.run_id) for row in rows],
        "wases": [row.was for row in rows],
        "scopes": [row.scope for row in rows],
    }


def _service_lease_params(schedule: str, lease: HeldLease) -> dict[str, object]:
    return {"schedule": schedule, "service_id": lease.job_id, "run_id": lease.run_id}


def _lease_arrays(leases: Sequence[HeldLease]) -> dict[str, object]:
    return {
        "job_ids": [lease.job_id for lease in leases],
        "run_ids": [str(lease.run_id) for lease in leases],
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
        "finished_ats": [_iso(outcome.finished_at) for outcome in outcomes],
        "durations_ms": [str(outcome.duration_ms) for outcome in outcomes],
        "errors": [outcome.error for outcome in outcomes],
        "bodies_ended": [_flag(outcome.body_ended) for outcome in outcomes],
    }
