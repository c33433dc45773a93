"""The claim: every slot and run-now request a wake claims, in one conditional UPDATE
of the jobs' free rows (fenced by the leader's lock connection), with their run rows,
in one commit; the running lease a started run takes with it."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..clock import LEASE_NOW_SQL
from ..errors import JobRowBusyError
from ..keys import LEADER_KEY_LOCKS_BOUND
from .base import StoreBase, as_text, flag, iso, lateness_ms
from .busy import lock_free_rows
from .prepared import PreparedCommit, begin_prepared, commit_prepared
from .reap import reap_jobs

__all__ = ["ClaimStore", "ClaimedSlot", "SlotClaim"]

# A run starts only when no other run holds the job: the claim's reap (same transaction,
# run rows locked) has already cleared every lease that ran out, so a run still named
# holds a live one, or one its own process renews. Time is judged there alone, on the
# run row that holds the lease (see reap.py), never here.
_STARTS = "(c.runs AND j.running_run_id IS NULL)"
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
            WHEN j.running_run_id IS NOT NULL THEN j.last_status
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


@dataclass(frozen=True)
class _Recording:
    """What a claim's UPDATE gave one job, for its run row."""

    status: str
    error: str | None
    run_id: int | None
    term: int
    next_slot: datetime
    running_until: datetime | None


class ClaimStore(StoreBase):
    """The claims of slots and run-now requests (part of JobStore)."""

    async def claim_many(
        self,
        items: Sequence[SlotClaim],
        *,
        now: datetime,
        fence_pid: int | None,
        prepared: PreparedCommit | None = None,
        renewing: Collection[int] = (),
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
        out is reaped first, unless its run is one of ``renewing``, those this process
        renews itself). A slot that already has its run is 'already_recorded'
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
            lease_now = self.lease_params(now)
            if prepared is not None:
                now, lease_now = await begin_prepared(self, conn, prepared)
            busy = await lock_free_rows(self, conn, ids)
            ordered = [item for item in ordered if item.job_id not in busy]
            if not ordered:
                return [busy.get(job_id) for job_id in ids]
            runs = [item.job_id for item in ordered if item.runs]
            if runs:
                reaps = await reap_jobs(self, conn, now, renewing, runs, lease_now)
                busy |= {job_id: JobRowBusyError(job_id) for job_id in reaps.held}
                ordered = [item for item in ordered if item.job_id not in busy]
                if not ordered:
                    return [busy.get(job_id) for job_id in ids]
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
                "dues": [iso(item.due) for item in ordered],
                "next_slots": [iso(item.next_slot) for item in ordered],
                "manuals": [flag(item.manual) for item in ordered],
                "runs": [flag(item.runs) for item in ordered],
                "statuses": [item.status for item in ordered],
                "run_ids": [as_text(run_ids.get(item.job_id)) for item in ordered],
                "lease_seconds": [as_text(item.lease_seconds) for item in ordered],
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
            rows: list[
                tuple[int | None, str, datetime, bool, str, int, int, str | None, datetime | None]
            ] = []
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
                recorded[item.job_id] = _Recording(
                    status,
                    error,
                    run_id,
                    row.term,
                    row.next_run_at,
                    row.running_until if run_id is not None else None,
                )
                if item.missed_before is not None:
                    # A passed-over slot that is already in the history stays as recorded.
                    missed_slot, note = item.missed_before
                    missed = (missed_ids[item.job_id], item.job_id, missed_slot, False)
                    rows.append(
                        (*missed, "missed", lateness_ms(now, missed_slot, 0.0), 0, note, None)
                    )
                fire = lateness_ms(now, item.run_slot, item.jitter)
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
                        recorded[item.job_id].running_until,
                    )
                )
            inserted = {
                (row.job_id, row.slot, row.manual): row.id
                for row in await conn.execute(
                    _INSERT_LEADER_RUNS,
                    {
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
                started = [slot.run_id for slot in results.values() if slot.status == "running"]
                await commit_prepared(
                    self, conn, prepared, fence_pid, started, now, lease_now["lease_now"]
                )
        return [results[job_id] if job_id in results else busy.get(job_id) for job_id in ids]

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
