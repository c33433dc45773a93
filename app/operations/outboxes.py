"""An outbox as a whole, as operators read and act on it: its counts by status and its
last drain, listed with whether an app still drains it, every stuck row reset at once,
and forgotten once no app drains it.

An app drains an outbox while its drain job (app.outbox.drain_job_id) is registered by
the schedule that claimed the outbox's name (``outbox_schedules``). Once that job is
retired (its schedule's leader no longer registers it, see app/scheduler/registration.py)
or gone (forgotten) the outbox is *retired*: nothing delivers its rows any more. An
outbox whose name no schedule claimed (rows written by hand, an outbox drained without
a scheduler) is never called retired: nothing here knows that nobody drains it.

Shared by the admin API, the admin page, the CLI and /metrics; raises AdminError
subclasses whose messages name the problem. One outbox's rows are messages.py's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.outbox import drain_job_id, reset_stuck
from app.outbox.sql import SCHEDULED
from app.scheduler.clock import LEASE_NOW_SQL
from app.scheduler.rowlocks import RowHeldError, held_by_sql, patient_write, row_holder
from app.storable import is_storable_text

from ..invocation import program
from .errors import Conflict, NotFound

__all__ = [
    "DELIVERED_WINDOW_SECONDS",
    "forget_outbox",
    "list_outboxes",
    "outbox_summary",
    "require_outbox",
    "reset_all_stuck",
]

# Per outbox, what costs what its live work costs, never what its history holds: the
# pending rows, apart from the scheduled ones (delayed messages whose moment is ahead),
# and the stuck rows (each read through its partial index), the oldest pending row's
# age on the lease clock (which rows are stamped on; a delayed message's counts from its
# moment, and a scheduled one has none yet), and the rows delivered in the last
# DELIVERED_WINDOW_SECONDS, to the minute: the sum of the per-minute counts the
# database keeps as rows are delivered (outbox_delivered_minutes, migration 0027), so
# that neither the delivered rows kept (OUTBOX_DELIVERED_DAYS) nor the last hour's, as
# many as a busy outbox delivered, are read. The
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
        (SELECT coalesce(sum(c.delivered), 0) FROM outbox_delivered_minutes c
         WHERE c.outbox = n.outbox
            AND c.minute > (SELECT {LEASE_NOW_SQL}
                - make_interval(secs => {DELIVERED_WINDOW_SECONDS})))::bigint AS delivered,
        extract(epoch FROM {LEASE_NOW_SQL}
            - (SELECT min(l.oldest_pending) FROM live l WHERE l.outbox = n.outbox))::float
            AS oldest_pending_seconds
    FROM names n
    """
)
_NO_JIT = text("SET LOCAL jit = off")
_LAST_DRAINS = text("SELECT outbox, last_drain_at, delivered, retried, stuck FROM outbox_drains")
_KNOWN_OUTBOX = text(
    "SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE outbox = :outbox)"
    " OR EXISTS (SELECT 1 FROM outbox_drains WHERE outbox = :outbox)"
)

# Per outbox name: the schedule that claimed it, and its drain job's state there.
_DRAINS = text(
    """
    SELECT d.outbox, s.schedule,
        s.outbox IS NOT NULL AND (j.id IS NULL OR j.retired_at IS NOT NULL) AS retired,
        j.retired_at
    FROM unnest(CAST(:names AS text[]), CAST(:job_ids AS text[])) AS d(outbox, job_id)
    LEFT JOIN outbox_schedules s ON s.outbox = d.outbox
    LEFT JOIN scheduler_jobs j ON j.schedule = s.schedule AND j.id = d.job_id
    """
)
# The name's claim locked while the outbox is forgotten: a schedule claiming it again
# meanwhile waits for the forget to end, then claims a name with no rows.
_FORGET_CHECK = text(
    f"""
    SELECT s.schedule, j.id IS NOT NULL AND j.retired_at IS NULL AS drained,
        EXISTS (
            SELECT 1 FROM outbox_messages m
            WHERE m.outbox = s.outbox AND m.status = 'pending' AND m.claimed_by IS NOT NULL
                AND m.next_attempt_at > {LEASE_NOW_SQL}) AS delivering
    FROM outbox_schedules s
    LEFT JOIN scheduler_jobs j ON j.schedule = s.schedule AND j.id = :job_id
    WHERE s.outbox = :outbox
    FOR UPDATE OF s
    """
)
_FORGET_MESSAGES = text("DELETE FROM outbox_messages WHERE outbox = :outbox")
_FORGET_OUTBOX = text(
    """
    WITH drains AS (DELETE FROM outbox_drains WHERE outbox = :outbox),
        counts AS (DELETE FROM outbox_delivered_minutes WHERE outbox = :outbox)
    DELETE FROM outbox_schedules WHERE outbox = :outbox
    """
)
_HELD_MESSAGE = row_holder(
    "outbox_messages", f"outbox = :outbox AND {held_by_sql('xmax')} IS NOT NULL LIMIT 1"
)


async def outbox_summary(
    engine: AsyncEngine, lease_now: datetime | None = None
) -> list[dict[str, Any]]:
    """Per outbox: ``counts`` of its pending, scheduled and stuck rows and of the rows
    it delivered in the last ``delivered_window_seconds`` (DELIVERED_WINDOW_SECONDS, to
    the minute: counts kept as rows are delivered, so that the answer costs what the
    live work costs, not the deliveries), the oldest pending age in seconds, the last
    drain. ``scheduled`` counts the delayed messages whose moment is ahead, apart from
    ``pending`` (due, or waiting for a retry). The ages, and what is scheduled, are
    read on the lease clock, which rows are stamped on: ``lease_now`` as
    clock.lease_now gives it, None for the database server's clock."""
    summary: dict[str, dict[str, Any]] = {}
    async with engine.begin() as conn:
        # Its estimates (bounds read at run time, a counter table autovacuum may not
        # have analyzed yet) can pass jit_above_cost: compiling the plan then took
        # 20 ms (bench/growth.py) for a read of 0.1 ms.
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
        for row in await conn.execute(_LAST_DRAINS):
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
            raise NotFound(f"no outbox named {outbox!r}; `{program()} outbox list` lists them")


async def _drains(conn: AsyncConnection, names: list[str]) -> dict[str, Any]:
    params = {"names": names, "job_ids": [drain_job_id(name) for name in names]}
    return {row.outbox: row for row in await conn.execute(_DRAINS, params)}


async def list_outboxes(
    engine: AsyncEngine, lease_now: datetime | None = None, *, retired: bool = False
) -> list[dict[str, Any]]:
    """Each outbox as outbox_summary gives it, with ``schedule``, the schedule
    that claimed its name (None when none did), ``retired`` (no app drains it: its
    drain job is retired or gone from that schedule) and ``retired_at`` (when its drain
    job was retired; None when it is gone or live). A retired outbox is listed only
    when ``retired``."""
    summary = await outbox_summary(engine, lease_now)
    async with engine.connect() as conn:
        drains = await _drains(conn, [entry["name"] for entry in summary])
    listed = []
    for entry in summary:
        drain = drains[entry["name"]]
        if drain.retired and not retired:
            continue
        listed.append(
            entry
            | {
                "schedule": drain.schedule,
                "retired": drain.retired,
                "retired_at": drain.retired_at,
            }
        )
    return listed


async def forget_outbox(engine: AsyncEngine, outbox: str) -> int:
    """Delete a retired outbox's rows (every message, its drain record and its name's
    claim) in one transaction; returns how many messages went. Raises NotFound for an
    unknown outbox and Conflict while an app drains it (its drain job is registered:
    remove the Outbox from the code and deploy first), while a drain of an older
    release still delivers one of its rows (its claim's lease runs, on the database
    server's clock), for an outbox whose name no schedule claimed (nothing tells
    whether something drains it), and when one of its rows stays held by another
    transaction past an operator's wait (the message names its backend pid)."""
    await require_outbox(engine, outbox)
    params = {"outbox": outbox, "job_id": drain_job_id(outbox), "lease_now": None}
    try:
        async with patient_write(engine, _HELD_MESSAGE, params) as conn:
            row = (await conn.execute(_FORGET_CHECK, params)).first()
            if row is None:
                raise Conflict(
                    f"outbox {outbox!r} was claimed by no schedule, so nothing tells whether "
                    "something drains it; delete its rows by hand if nothing does"
                )
            if row.drained:
                raise Conflict(
                    f"outbox {outbox!r}: an app of schedule {row.schedule!r} drains it (its "
                    f"drain job {drain_job_id(outbox)!r} is registered); remove the Outbox "
                    "from the code and deploy first (a promotion then retires it)"
                )
            if row.delivering:
                raise Conflict(
                    f"outbox {outbox!r}: a drain is delivering one of its rows; forget it "
                    "when that delivery has ended"
                )
            messages = (await conn.execute(_FORGET_MESSAGES, params)).rowcount
            await conn.execute(_FORGET_OUTBOX, params)
    except RowHeldError as exc:
        holder = "" if exc.held_by is None else f" (backend pid {exc.held_by})"
        raise Conflict(
            f"outbox {outbox!r}: one of its rows stayed held by another transaction{holder} "
            "past the wait; try again, or end that transaction (see pg_stat_activity)"
        ) from None
    return messages


async def reset_all_stuck(
    engine: AsyncEngine, outbox: str, lease_now: datetime | None = None
) -> dict[str, Any]:
    """Make every stuck row of ``outbox`` pending, attempts 0 and due now, in one
    statement (app.outbox.reset_stuck), read on the lease clock (``lease_now`` as
    clock.lease_now gives it, None for the database server's). Returns ``reset``, the
    rows reset, and ``held``, the stuck rows another transaction held, left alone and
    never waited on. Raises NotFound for an unknown outbox."""
    await require_outbox(engine, outbox)
    done = await reset_stuck(engine, outbox, lease_now)
    return {"reset": done.reset, "held": done.held}
