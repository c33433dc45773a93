"""The outbox's SQL, in one place: tests pin the claim statement as a known answer.

Every lease and due time is written and compared on the lease clock (LEASE_NOW_SQL,
``:lease_now``): the database server's, never the host's, whose clock may run ahead of
another drain's by more than a lease; or a test's FakeClock. So are the rows' records
(created_at, updated_at, delivered_at, a drain's last_drain_at), which operators read
beside them.
"""

from __future__ import annotations

from sqlalchemy import text

from app.scheduler.clock import LEASE_END_SQL, LEASE_NOW_SQL

__all__ = [
    "CLAIM_DUE",
    "CLAIM_NAME",
    "CLAIM_ONE",
    "INSERT",
    "LOCK_ROWS",
    "MARK_DELIVERED",
    "MARK_FAILED",
    "NEXT_DUE",
    "NOTIFY",
    "NOTIFY_CHANNEL",
    "RECORD_DRAIN",
    "RELEASE",
    "RESET",
    "RESET_STUCK",
    "SCHEDULED",
    "SELECT_EXISTING",
    "SELECT_STATUS",
    "STILL_CLAIMED",
]

NOTIFY_CHANNEL = "regent_outbox"

# Claim the outbox's name for a schedule, once per database, and read back the schedule
# it belongs to (its own, or the one that claimed it first). The primary key makes a
# concurrent second claim a conflict, read back in a later statement (the caller asks
# again until a row answers).
CLAIM_NAME = text(
    """
    WITH claimed AS (
        INSERT INTO outbox_schedules (outbox, schedule) VALUES (:outbox, :schedule)
        ON CONFLICT (outbox) DO NOTHING RETURNING schedule)
    SELECT schedule FROM claimed
    UNION ALL
    SELECT schedule FROM outbox_schedules WHERE outbox = :outbox
    """
)

# A claim moves the row's next_attempt_at past the delivery lease (``:lease_seconds``)
# and stamps it with the drain's token, in a commit of its own: other drains skip the
# row while the lease runs, and no transaction stays open across the network call. The
# due bound reads the lease clock once, through a scalar subquery, so that it bounds
# the index scan (clock_timestamp() itself is volatile).
CLAIM_DUE = text(
    f"""
    UPDATE outbox_messages AS m
    SET claimed_by = :token, next_attempt_at = {LEASE_END_SQL}, updated_at = {LEASE_NOW_SQL}
    WHERE m.id IN (
        SELECT id FROM outbox_messages
        WHERE outbox = :outbox AND status = 'pending'
            AND next_attempt_at <= (SELECT {LEASE_NOW_SQL})
        ORDER BY next_attempt_at, id
        LIMIT :batch_size
        FOR UPDATE SKIP LOCKED
    )
    RETURNING m.id, m.key, m.payload, m.attempts
    """
)

CLAIM_ONE = text(
    f"""
    UPDATE outbox_messages AS m
    SET claimed_by = :token, next_attempt_at = {LEASE_END_SQL}, updated_at = {LEASE_NOW_SQL}
    WHERE m.id IN (
        SELECT id FROM outbox_messages
        WHERE id = :id AND outbox = :outbox AND status = 'pending'
            AND next_attempt_at <= {LEASE_NOW_SQL}
        FOR UPDATE SKIP LOCKED
    )
    RETURNING m.id, m.key, m.payload, m.attempts
    """
)

# The insert and the wake-up in one round trip: pg_notify runs once per row inserted,
# so a key the outbox already has (nothing inserted) wakes nobody. A delayed row is
# due at ``:deliver_at`` (an absolute moment) or ``:delay`` after now on the lease
# clock, never the host's, and keeps that moment in deliver_at; a row due at once has
# a delay of zero and no deliver_at.
INSERT = text(
    f"""
    WITH inserted AS (
        INSERT INTO outbox_messages
            (outbox, key, payload, status, attempts, next_attempt_at, deliver_at,
            created_at, updated_at)
        SELECT :outbox, :key, CAST(:payload AS jsonb), 'pending', 0,
            COALESCE(moment, {LEASE_NOW_SQL}), moment, {LEASE_NOW_SQL}, {LEASE_NOW_SQL}
        FROM (SELECT COALESCE(CAST(:deliver_at AS timestamptz),
            {LEASE_NOW_SQL} + NULLIF(CAST(:delay AS interval), interval '0')) AS moment) AS due
        ON CONFLICT (outbox, key) DO NOTHING
        RETURNING id
    )
    SELECT id, pg_notify('{NOTIFY_CHANNEL}', :outbox) FROM inserted
    """
)

# Seconds until the outbox's next pending row falls due (a delayed row, a retry, a
# claim's lease running out), or NULL: what the wake-up sleeps for; and the lease
# clock's now it was read at. One probe of the due index (outbox, next_attempt_at),
# whatever the number of rows. Counted from ``:since``, the now of the wake-up's
# previous probe (taken before the drain that just ran): a row that fell due since,
# after the drain's last claim looked, is due at once (0). A row due before then was
# due when that drain began, which took it or left it (another transaction holds it):
# not counted, or a wake-up for it would spin; the drain job takes it. No such row: NULL
# (not GREATEST(NULL, 0), which is 0 in PostgreSQL: GREATEST ignores NULLs, and a
# wake-up told "due now" with nothing pending ran thousands of passes a second).
NEXT_DUE = text(
    f"""
    SELECT CASE WHEN due.at IS NOT NULL
            THEN GREATEST(extract(epoch FROM due.at - probe.now)::float, 0) END AS seconds,
        probe.now
    FROM (SELECT {LEASE_NOW_SQL} AS now) AS probe,
        LATERAL (
            SELECT min(next_attempt_at) AS at FROM outbox_messages
            WHERE outbox = :outbox AND status = 'pending'
                AND next_attempt_at > CAST(:since AS timestamptz)) AS due
    """
)

SCHEDULED = (
    f"(status = 'pending' AND deliver_at IS NOT NULL AND deliver_at > (SELECT {LEASE_NOW_SQL}))"
)
"""The condition (SQL, on ``:lease_now``; never NULL) of a scheduled row: a delayed
message whose moment is still ahead. Operators' counts and lists show it apart from
pending."""

SELECT_STATUS = text(
    "SELECT status, next_attempt_at FROM outbox_messages WHERE id = :id AND outbox = :outbox"
)

SELECT_EXISTING = text("SELECT id FROM outbox_messages WHERE outbox = :outbox AND key = :key")

# NOTIFY is transactional: sent at commit, never on rollback, and PostgreSQL folds
# identical notifications of one transaction into one.
NOTIFY = text(f"SELECT pg_notify('{NOTIFY_CHANNEL}', :outbox)")

# The rows of a batch no other transaction holds, locked as the statement's UPDATE would
# lock them: an outcome write, like a claim, never waits on a row another transaction
# holds (an operator's psql session left open on SELECT ... FOR UPDATE), whatever
# lock_timeout the database sets (none by default): a wait there would hold up the
# outcomes of every other row of the pass until their leases ran out. Locked once, as
# an array (an InitPlan), that the UPDATE then looks up in the primary key: as a
# subquery joined to the table (m.id IN (...)) the planner read the whole table per
# batch, or the batch again per row of it.
_FREE_ROWS = """m.id = ANY(ARRAY(
        SELECT id FROM outbox_messages WHERE id = ANY(CAST(:ids AS bigint[]))
        FOR UPDATE SKIP LOCKED))"""

# Outcomes are written a batch at a time, each row only while its own claim's token
# still holds it and no other transaction holds it; RETURNING names the rows that
# matched, so a lost claim is never counted as an outcome (STILL_CLAIMED tells a held
# row, whose outcome is written later, from a lost one).
MARK_DELIVERED = text(
    f"""
    UPDATE outbox_messages AS m
    SET status = 'delivered', attempts = m.attempts + 1, delivered_at = {LEASE_NOW_SQL},
        updated_at = {LEASE_NOW_SQL}, last_error = NULL, claimed_by = NULL
    FROM unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS d(id, token)
    WHERE m.id = d.id AND m.claimed_by = d.token AND {_FREE_ROWS}
    RETURNING m.id
    """
)

# A failed row is due again its backoff (``retry_in`` seconds) after the outcome is
# written, on the lease clock.
MARK_FAILED = text(
    f"""
    UPDATE outbox_messages AS m
    SET status = f.status, attempts = f.attempts,
        next_attempt_at = {LEASE_NOW_SQL} + make_interval(secs => f.retry_in),
        last_error = f.error, updated_at = {LEASE_NOW_SQL}, claimed_by = NULL
    FROM unnest(
        CAST(:ids AS bigint[]), CAST(:tokens AS uuid[]), CAST(:statuses AS text[]),
        CAST(:attempts AS integer[]), CAST(:retry_in AS double precision[]),
        CAST(:errors AS text[])
    ) AS f(id, token, status, attempts, retry_in, error)
    WHERE m.id = f.id AND m.claimed_by = f.token AND {_FREE_ROWS}
    RETURNING m.id
    """
)

# Of the rows an outcome write did not match, those its claim still holds: another
# transaction held them (a plain read waits on no row lock); the others' claims were
# lost.
STILL_CLAIMED = text(
    """
    SELECT m.id
    FROM outbox_messages AS m
    JOIN unnest(CAST(:ids AS bigint[]), CAST(:tokens AS uuid[])) AS d(id, token)
        ON m.id = d.id AND m.claimed_by = d.token
    """
)

# A held row's outcome is written later in a transaction that waits for it, up to
# ROW_LOCK_PATIENCE (app/scheduler/rowlocks.py).
LOCK_ROWS = text(
    "SELECT id FROM outbox_messages WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY id FOR UPDATE"
)

# Claimed rows that could not start in time are given back, due now, untouched
# otherwise: they were never attempted. A row another transaction holds is left to its
# lease, never waited on.
RELEASE = text(
    f"""
    UPDATE outbox_messages AS m
    SET claimed_by = NULL, next_attempt_at = {LEASE_NOW_SQL}, updated_at = {LEASE_NOW_SQL}
    WHERE m.id = ANY(CAST(:ids AS bigint[])) AND m.claimed_by = :token AND {_FREE_ROWS}
    """
)

RECORD_DRAIN = text(
    f"""
    INSERT INTO outbox_drains (outbox, last_drain_at, delivered, retried, stuck)
    VALUES (:outbox, {LEASE_NOW_SQL}, :delivered, :retried, :stuck)
    ON CONFLICT (outbox) DO UPDATE SET
        last_drain_at = excluded.last_drain_at, delivered = excluded.delivered,
        retried = excluded.retried, stuck = excluded.stuck
    """
)

# A reset makes the row due now, a scheduled one too (its deliver_at is cleared). It
# never takes a row from a live claim: the drain holding it is delivering it,
# and a row made due again would be delivered by a second drain as well. A claim whose
# lease ran out (next_attempt_at <= now, on the lease clock) is dead, as for CLAIM_DUE.
RESET = text(
    f"""
    UPDATE outbox_messages
    SET status = 'pending', attempts = 0, next_attempt_at = {LEASE_NOW_SQL},
        deliver_at = NULL, updated_at = {LEASE_NOW_SQL}, last_error = NULL, claimed_by = NULL
    WHERE id = :id AND outbox = :outbox
        AND (status = 'stuck'
             OR (status = 'pending'
                 AND (claimed_by IS NULL OR next_attempt_at <= {LEASE_NOW_SQL})))
    RETURNING id
    """
)

# Every stuck row of an outbox made due now, as RESET makes one, in one statement that
# never waits on a row: a row another transaction holds (a drain writing an outcome, an
# operator's open psql) is skipped (SKIP LOCKED) and counted as held, read from the
# statement's snapshot. The drain is woken once when any row was reset.
RESET_STUCK = text(
    f"""
    WITH stuck AS (
        SELECT count(*) AS rows FROM outbox_messages WHERE outbox = :outbox AND status = 'stuck'
    ), reset AS (
        UPDATE outbox_messages AS m
        SET status = 'pending', attempts = 0, next_attempt_at = {LEASE_NOW_SQL},
            deliver_at = NULL, updated_at = {LEASE_NOW_SQL}, last_error = NULL,
            claimed_by = NULL
        WHERE m.id IN (
            SELECT id FROM outbox_messages
            WHERE outbox = :outbox AND status = 'stuck'
            FOR UPDATE SKIP LOCKED
        )
        RETURNING m.id
    ), counted AS (
        SELECT count(*) AS rows FROM reset
    )
    SELECT counted.rows AS reset, GREATEST(stuck.rows - counted.rows, 0) AS held,
        CASE WHEN counted.rows > 0 THEN pg_notify('{NOTIFY_CHANNEL}', :outbox) END AS woken
    FROM stuck, counted
    """
)
