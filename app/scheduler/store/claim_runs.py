"""The run rows a claim records: one insert of every claimed job's run row (and of the
slots an outage passed over before it), in the claim's transaction; a slot that has its
run already keeps it and runs nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from .base import StoreBase, as_text, flag, iso, lateness_ms
from .slots import ClaimedSlot, SlotClaim

__all__ = ["Recording", "record_runs"]

# The leader run rows of a claim, in one statement; a slot that already has its run
# keeps it (the row given is left out of RETURNING). A started run's row holds its
# running lease (``running_until``, as the claim took it on the job row): renewed there,
# where no lock on the job row can keep a renewal out.
_INSERT_LEADER_RUNS = text(
    """
    INSERT INTO scheduler_runs
        (id, schedule, job_id, scope, slot, manual, started_at, finished_at, status,
         lateness_ms, jitter_ms, pid, host, error, running_until)
    SELECT COALESCE(r.id, nextval(pg_get_serial_sequence('scheduler_runs', 'id'))),
        :schedule, r.job_id, 'leader', r.slot, r.manual, CAST(:now AS timestamptz),
        CASE WHEN r.status = 'running' THEN NULL ELSE CAST(:now AS timestamptz) END,
        r.status, r.lateness_ms, r.jitter_ms, :pid, :host, r.error, r.running_until
    FROM unnest(CAST(CAST(:ids AS text[]) AS bigint[]), CAST(:job_ids AS text[]),
            CAST(CAST(:slots AS text[]) AS timestamptz[]),
            CAST(CAST(:manuals AS text[]) AS boolean[]), CAST(:statuses AS text[]),
            CAST(CAST(:lateness_ms AS text[]) AS bigint[]),
            CAST(CAST(:jitter_ms AS text[]) AS bigint[]), CAST(:errors AS text[]),
            CAST(CAST(:running_untils AS text[]) AS timestamptz[]))
        WITH ORDINALITY AS r(id, job_id, slot, manual, status, lateness_ms, jitter_ms, error,
            running_until, n)
    ORDER BY r.n
    ON CONFLICT (schedule, job_id, slot, manual) WHERE scope = 'leader' DO NOTHING
    RETURNING id, job_id, slot, manual
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


@dataclass(frozen=True)
class Recording:
    """What a claim's UPDATE gave one job, for its run row."""

    status: str
    error: str | None
    run_id: int | None
    term: int
    next_slot: datetime
    running_until: datetime | None


# One run row to insert: (id, job id, slot, manual, status, lateness ms, jitter ms,
# error, running_until).
_RunRow = tuple[int | None, str, datetime, bool, str, int, int, str | None, datetime | None]


async def record_runs(
    store: StoreBase,
    conn: AsyncConnection,
    ordered: Sequence[SlotClaim],
    recorded: dict[str, Recording],
    missed_ids: dict[str, int],
    now: datetime,
) -> dict[str, ClaimedSlot]:
    """Insert the run rows of the claims in ``ordered`` that matched (``recorded``: what
    the claim's UPDATE gave each), with a 'missed' row before each that passed over
    slots (its id from ``missed_ids``), started at ``now``, in ``conn``'s transaction;
    return each job's run row and status. A slot that has its run already is
    'already_recorded' (see _already_recorded)."""
    rows: list[_RunRow] = []
    for item in ordered:
        got = recorded.get(item.job_id)
        if got is None:
            continue
        if item.missed_before is not None:
            # A passed-over slot that is already in the history stays as recorded.
            missed_slot, note = item.missed_before
            missed = (missed_ids[item.job_id], item.job_id, missed_slot, False)
            rows.append((*missed, "missed", lateness_ms(now, missed_slot, 0.0), 0, note, None))
        fire = lateness_ms(now, item.run_slot, item.jitter)
        jitter_ms = int(item.jitter * 1000)
        rows.append(
            (
                got.run_id,
                item.job_id,
                item.run_slot,
                item.manual,
                got.status,
                fire,
                jitter_ms,
                got.error,
                got.running_until,
            )
        )
    inserted = {
        (row.job_id, row.slot, row.manual): row.id
        for row in await conn.execute(_INSERT_LEADER_RUNS, _insert_params(store, rows, now))
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
        results[item.job_id] = await _already_recorded(store, conn, item, got)
    return results


def _insert_params(store: StoreBase, rows: list[_RunRow], now: datetime) -> dict[str, object]:
    return {
        "ids": [as_text(row[0]) for row in rows],
        "job_ids": [row[1] for row in rows],
        "slots": [iso(row[2]) for row in rows],
        "manuals": [flag(row[3]) for row in rows],
        "statuses": [row[4] for row in rows],
        "lateness_ms": [str(row[5]) for row in rows],
        "jitter_ms": [str(row[6]) for row in rows],
        "errors": [row[7] for row in rows],
        "running_untils": [iso(row[8]) for row in rows],
        "now": now,
        "pid": store.pid,
        "host": store.host,
        "schedule": store.schedule,
    }


async def _already_recorded(
    store: StoreBase, conn: AsyncConnection, item: SlotClaim, got: Recording
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
                "schedule": store.schedule,
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
                "schedule": store.schedule,
            },
        )
    return ClaimedSlot(
        recorded.id,
        "already_recorded",
        got.term,
        got.next_slot,
        f"slot {item.run_slot.isoformat()} already has run {recorded.id} ({recorded.status})",
    )
