"""The claim: every slot and run-now request a wake claims, in one conditional UPDATE
of the jobs' free rows (fenced by the leader's lock connection), with their run rows,
in one commit; the running lease a started run takes with it. Its steps, in one
transaction: the busy rows left out (busy.py) and the lapsed leases reaped (reap.py) in
one statement, run ids allocated, the one UPDATE, the run rows recorded (claim_runs.py), and a
prepared claim's wait for its commit (prepared.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Row, text
from sqlalchemy.ext.asyncio import AsyncConnection

from ..clock import LEASE_NOW_SQL
from ..errors import JobRowBusyError
from ..keys import LEADER_KEY_LOCKS_BOUND
from .base import StoreBase, as_text, flag, iso
from .claim_runs import Recording, record_runs
from .prepared import PreparedCommit, begin_prepared, commit_prepared
from .reap import lock_and_reap
from .slots import ClaimedSlot, SlotClaim

__all__ = ["ClaimStore"]

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
        there are: one lock of their rows with the reap of their lapsed leases, one
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

        ``prepared``: commit at its ``commit_at`` (PreparedCommit.wait) rather than at
        once (``now`` is then its ``starts_at``); a cancel meanwhile, or its leadership
        lost by then (PreparedClaimDropped), rolls the claim back and propagates. A
        fenced prepared claim checks its fence again before it commits and raises
        PreparedClaimDropped (rolled back) when the key is gone.
        """
        if not items:
            return []
        ids = [item.job_id for item in items]
        assert len(set(ids)) == len(ids), "one claim per job at a time"
        assert all(item.status != "running" or item.lease_seconds is not None for item in items), (
            "a run needs the length of its lease"
        )
        # Rows in id order: two claims of overlapping jobs lock them in the same order.
        ordered = sorted(items, key=lambda item: item.job_id)
        results: dict[str, ClaimedSlot] = {}
        async with self.engine.begin() as conn:
            lease_now = self.lease_params(now)
            if prepared is not None:
                now, lease_now = await begin_prepared(self, conn, prepared)
            busy = await self._busy(conn, ids, ordered, now, renewing, lease_now)
            ordered = [item for item in ordered if item.job_id not in busy]
            if ordered:
                results = await self._claim_free(conn, ordered, now, fence_pid, prepared, lease_now)
        return [results[job_id] if job_id in results else busy.get(job_id) for job_id in ids]

    async def _busy(
        self,
        conn: AsyncConnection,
        ids: list[str],
        ordered: list[SlotClaim],
        now: datetime,
        renewing: Collection[int],
        lease_now: dict[str, object],
    ) -> dict[str, JobRowBusyError]:
        """Lock the free rows of ``ids`` and reap the lapsed leases of the jobs that
        would start a run; return the jobs left out as busy: their row is held
        elsewhere, or their dead run's row is (its lease is kept until a later reap)."""
        runs = [item.job_id for item in ordered if item.runs]
        held, reaps = await lock_and_reap(self, conn, ids, runs, now, renewing, lease_now)
        return {job_id: JobRowBusyError(job_id) for job_id in held + reaps.held}

    async def _claim_free(
        self,
        conn: AsyncConnection,
        ordered: list[SlotClaim],
        now: datetime,
        fence_pid: int | None,
        prepared: PreparedCommit | None,
        lease_now: dict[str, object],
    ) -> dict[str, ClaimedSlot]:
        """Claim the jobs of ``ordered`` (their rows locked here) in one UPDATE, record
        their run rows and, for a ``prepared`` claim, wait for its commit (see
        claim_many); return each matched job's run row and status."""
        missed_ids, run_ids = await _allocate_run_ids(conn, ordered)
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
            return {}
        if prepared is not None:
            now = prepared.start()
        recorded = _recordings(ordered, claimed, run_ids)
        results = await record_runs(self, conn, ordered, recorded, missed_ids, now)
        if prepared is not None:
            started = [slot.run_id for slot in results.values() if slot.status == "running"]
            await commit_prepared(
                self, conn, prepared, fence_pid, started, now, lease_now["lease_now"]
            )
        return results


async def _allocate_run_ids(
    conn: AsyncConnection, ordered: list[SlotClaim]
) -> tuple[dict[str, int], dict[str, int]]:
    """Run ids for the claims of ``ordered``: each passed-over slot's 'missed' row and
    each run's (its lease token), by job. History reads in id order: a job's
    passed-over slots get the lower id, though the claim allocates the run's first."""
    wanted = sum(item.runs + (item.missed_before is not None) for item in ordered)
    allocated = []
    if wanted:
        allocated = [row.id for row in await conn.execute(_NEXT_RUN_IDS, {"count": wanted})]
    fresh = iter(sorted(allocated))
    missed_ids = {item.job_id: next(fresh) for item in ordered if item.missed_before is not None}
    run_ids = {item.job_id: next(fresh) for item in ordered if item.runs}
    return missed_ids, run_ids


def _recordings(
    ordered: list[SlotClaim], claimed: dict[str, Row[Any]], run_ids: dict[str, int]
) -> dict[str, Recording]:
    """What the claim's UPDATE gave each job of ``ordered`` that it matched: a run
    refused because another body holds the job is 'skipped_overlap', naming that run."""
    recorded: dict[str, Recording] = {}
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
        recorded[item.job_id] = Recording(
            status,
            error,
            run_id,
            row.term,
            row.next_run_at,
            row.running_until if run_id is not None else None,
        )
    return recorded
