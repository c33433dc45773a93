"""Running leases held by this process: their renewal (one statement per kind of row
that holds them), and a service copy's lease, taken and released."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import TextClause, text

from ..clock import LEASE_END_SQL as _LEASE_END
from ..clock import LEASE_NOW_SQL
from ..keys import LEADER_KEY_LOCKS_BOUND, WAKE_CHANNEL
from ..rowlocks import ROW_LOCK_PATIENCE
from .base import Statement, Steps, StoreBase, lease_reading, run_steps

__all__ = [
    "HeldLease",
    "LeaseKind",
    "LeaseStore",
    "ServiceTake",
    "leader_run_leased_sql",
    "renew_steps",
    "service_release",
]


def leader_run_leased_sql(job: str) -> str:
    """SQL that is true while the job row aliased ``job`` names a leader run whose
    running lease holds, on the lease clock (``:lease_now``): the one "is a leader run
    of this job running" predicate. The lease lives on the run's row; the job row's copy
    of its end may lag behind it (renewed only while that row is free), and a run of a
    release before run-row leases has only the copy."""
    return (
        f"(coalesce({job}.running_until > {LEASE_NOW_SQL}, false) OR EXISTS ("
        f"SELECT 1 FROM scheduler_runs leased WHERE leased.id = {job}.running_run_id"
        f" AND leased.running_until > {LEASE_NOW_SQL}))"
    )


# Where a running lease is held: on a run's own row, named by its job's row (a leader
# run, which holds the job), on a run's own row alone (a per-worker run), on a copy's
# own row, named by its service's row (a service copy).
LeaseKind = Literal["job", "run", "service"]


@dataclass(frozen=True)
class HeldLease:
    """A running lease a run of this process holds, by its token ``run_id`` (a run id),
    on the row ``kind`` names: the run's own row, named by ``job_id``'s row, for a
    leader run (``job``), the run's own row for a per-worker run (``run``), the copy's
    own row, named by the row of the service ``job_id``, for a service copy
    (``service``)."""

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


# The leases of a batch of runs (l): a job run's (a leader run's and a per-worker
# run's) is held on its own run row; a reaped run no longer holds one.
_LEASES = """unnest(CAST(:job_ids AS text[]), CAST(CAST(:run_ids AS text[]) AS bigint[]))
        AS l(job_id, run_id)"""
# A leader run's lease: renewed on its run row, which no one but the reaper (which
# clears it) and its own outcome lock, so another transaction holding the job row
# (an operator's SELECT ... FOR UPDATE) cannot keep the renewal out while the lease
# runs out. The job row's copy (what a leader's rows and operators read) follows where
# no other transaction holds that row (SKIP LOCKED: never waited on).
_RENEW_LEASES = text(
    f"""
    WITH runs AS (
        UPDATE scheduler_runs r SET running_until = {_LEASE_END}
        FROM {_LEASES}
        WHERE r.id = l.run_id AND r.running_until IS NOT NULL
        RETURNING l.job_id, l.run_id, r.running_until
    ), free_jobs AS (
        SELECT j.id, runs.running_until FROM scheduler_jobs j
        JOIN runs ON j.id = runs.job_id AND j.running_run_id = runs.run_id
        WHERE j.schedule = :schedule
        FOR NO KEY UPDATE OF j SKIP LOCKED
    ), copied AS (
        UPDATE scheduler_jobs j SET running_until = f.running_until
        FROM free_jobs f
        WHERE j.schedule = :schedule AND j.id = f.id
    )
    SELECT run_id FROM runs
    """
)


def _renew_run_rows(table: str) -> TextClause:
    """The renewal of leases held on runs' own rows in ``table`` (a run whose lease was
    reaped or taken over has none left to renew)."""
    return text(
        f"""
        UPDATE {table} r SET running_until = {_LEASE_END}
        FROM {_LEASES}
        WHERE r.id = l.run_id AND r.running_until IS NOT NULL
        RETURNING l.run_id
        """
    )


# A service copy's lease, on its own row in scheduler_service_runs (taken as the copy
# is about to start, its token a run id), named on its service's row (s). No one but
# the copy's renewal, a take that judges it lapsed, and its release locks the copy's
# row, so another transaction holding the service's row cannot keep the renewal out.
# The take: the service's row, locked (written first if it is the first copy's), names
# the holder; the holder's lease row is read locked (a renewal under way commits
# first, and is then read), so that a take never judges a lease lapsed that a renewal
# keeps; a lapsed one is removed, so the old copy's next renewal finds it lost.
_ENSURE_SERVICE_ROW = text(
    """
    INSERT INTO scheduler_services (schedule, id) VALUES (:schedule, :service_id)
    ON CONFLICT (schedule, id) DO NOTHING
    """
)
_SERVICE_HOLDER = text(
    """
    SELECT running_run_id, running_pid, running_host FROM scheduler_services
    WHERE schedule = :schedule AND id = :service_id
    FOR UPDATE
    """
)
_HOLDERS_LEASE_LEFT = text(
    f"""
    SELECT EXTRACT(epoch FROM running_until - {LEASE_NOW_SQL}) AS left_seconds
    FROM scheduler_service_runs WHERE id = :run_id
    FOR UPDATE
    """
)
_DROP_LAPSED_SERVICE_RUN = text("DELETE FROM scheduler_service_runs WHERE id = :run_id")
# Only while this leader's lock connection holds the key.
_TAKE_SERVICE_LEASE = text(
    f"""
    WITH taken AS (
        INSERT INTO scheduler_service_runs (id, schedule, service_id, running_until)
        SELECT nextval(pg_get_serial_sequence('scheduler_runs', 'id')),
            CAST(:schedule AS text), CAST(:service_id AS text), {_LEASE_END}
        WHERE EXISTS (
            SELECT 1 FROM pg_locks
            WHERE {LEADER_KEY_LOCKS_BOUND} AND granted AND pid = :fence_pid)
        RETURNING id
    )
    UPDATE scheduler_services s
    SET running_run_id = taken.id, running_since = {LEASE_NOW_SQL},
        running_pid = CAST(:pid AS integer), running_host = CAST(:host AS text)
    FROM taken
    WHERE s.schedule = :schedule AND s.id = :service_id
    RETURNING taken.id
    """
)
# Released by its token: its lease row goes; the service's row stops naming it where
# no other transaction holds that row (a row that names a copy without a lease row
# names none that holds). The NOTIFY (sent at commit) wakes a leader waiting to start
# the next copy.
_RELEASE_SERVICE_LEASE = text(
    f"""
    WITH released AS (
        DELETE FROM scheduler_service_runs WHERE id = :run_id RETURNING id
    ), free AS (
        SELECT s.id FROM scheduler_services s
        WHERE s.schedule = :schedule AND s.id = :service_id AND s.running_run_id = :run_id
        FOR NO KEY UPDATE SKIP LOCKED
    ), cleared AS (
        UPDATE scheduler_services s
        SET running_run_id = NULL, running_since = NULL, running_pid = NULL,
            running_host = NULL
        FROM free
        WHERE s.schedule = :schedule AND s.id = free.id
    )
    SELECT pg_notify('{WAKE_CHANNEL}', CAST(:service_id AS text)) FROM released
    """
)
# Every lease kind's renewal, by the row that holds the lease.
_RENEWALS = {
    "job": _RENEW_LEASES,
    "run": _renew_run_rows("scheduler_runs"),
    "service": _renew_run_rows("scheduler_service_runs"),
}


class LeaseStore(StoreBase):
    """The renewal of running leases and the service leases (part of JobStore)."""

    async def renew_leases(self, leases: Sequence[HeldLease], lease_seconds: float) -> set[int]:
        """Renew the running lease of every run in ``leases`` for ``lease_seconds``, in one
        commit of at most one statement per kind however many there are (leader
        and per-worker runs' leases are on their own run rows, service copies'
        on their own rows; none is kept out by a job's or a service's row held
        elsewhere). Returns the tokens of the leases still held; a lease left
        out was lost (it ran out and another run took the job or the service, or
        the run was reaped). Raises what the database raises, after at most a
        second's wait for a row another transaction holds; nothing is renewed
        then."""
        steps = renew_steps(self.schedule, leases, lease_seconds, lease_reading(self.lease_clock))
        async with self.engine.begin() as conn:
            await conn.execute(ROW_LOCK_PATIENCE)
            return await run_steps(conn, steps)

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
            | self.lease_params()
        )
        async with self.engine.begin() as conn:
            await conn.execute(_ENSURE_SERVICE_ROW, params)
            holder = (await conn.execute(_SERVICE_HOLDER, params)).one()
            if holder.running_run_id is not None:
                named = params | {"run_id": holder.running_run_id}
                left = (await conn.execute(_HOLDERS_LEASE_LEFT, named)).scalar_one_or_none()
                if left is not None and left > 0:
                    return ServiceTake(None, holder.running_pid, holder.running_host, float(left))
                await conn.execute(_DROP_LAPSED_SERVICE_RUN, named)
            taken = (await conn.execute(_TAKE_SERVICE_LEASE, params)).scalar_one_or_none()
        return ServiceTake(None if taken is None else int(taken))

    async def release_service_lease(self, lease: HeldLease) -> None:
        """Release service copy ``lease`` if it still holds it, as the copy's task and
        every thread it started ended; a leader waiting to start the service is woken."""
        async with self.engine.begin() as conn:
            await conn.execute(*service_release(self.schedule, lease))


def renew_steps(
    schedule: str, leases: Sequence[HeldLease], lease_seconds: float, lease_now: datetime | None
) -> Steps[set[int]]:
    """The one renewal of running leases, for the loop's keeper (LeaseStore.renew_leases)
    and a thread's (ThreadStore.renew_lease): one statement per kind of row that holds
    them; answers the tokens of the leases still held. ``lease_now``: the lease clock's
    reading (None: the server's)."""
    params: dict[str, object] = {
        "lease_seconds": lease_seconds,
        "schedule": schedule,
        "lease_now": lease_now,
    }
    renewed: set[int] = set()
    # Rows in job id order, as claims lock them: a renewal never deadlocks with one.
    leases = sorted(leases, key=lambda lease: (lease.job_id, lease.run_id))
    for kind, statement in _RENEWALS.items():
        batch = [lease for lease in leases if lease.kind == kind]
        if batch:
            rows = yield statement, params | _lease_arrays(batch)
            renewed.update(row.run_id for row in rows)
    return renewed


def service_release(schedule: str, lease: HeldLease) -> Statement:
    """The release of service copy ``lease``, from the loop or a thread (see
    LeaseStore.release_service_lease)."""
    params = {"schedule": schedule, "service_id": lease.job_id, "run_id": lease.run_id}
    return _RELEASE_SERVICE_LEASE, params


def _lease_arrays(leases: Sequence[HeldLease]) -> dict[str, object]:
    return {
        "job_ids": [lease.job_id for lease in leases],
        "run_ids": [str(lease.run_id) for lease in leases],
    }
