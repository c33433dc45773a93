"""Job rows as the leader reads them: every row at a promotion, the rows changed since
a read (change marks), and some rows by id."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text

from .base import StoreBase

__all__ = ["ChangedRows", "JobRow", "JobRowStore", "StoredJob", "StoredJobs"]

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
    " running_until, retired_at IS NOT NULL AS retired FROM scheduler_jobs"
    " WHERE schedule = :schedule"
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
    leader_only), whether it is retired, and its schedule state."""

    name: str
    trigger: str
    leader_only: bool
    retired: bool
    row: JobRow


@dataclass(frozen=True)
class StoredJobs:
    """Every job row of a schedule, its broken marks, and the ``horizon`` to read the
    changes made since from (JobStore.changed_rows)."""

    horizon: str
    jobs: dict[str, StoredJob]
    broken: frozenset[str]

    def retirement_wrong(self, job_ids: Iterable[str]) -> bool:
        """Whether a row read is retired while ``job_ids`` (a registry's) has its id, or
        not retired while they lack it: what a promotion's settle_retirement would
        write."""
        registered = set(job_ids)
        return any(job.retired == (job_id in registered) for job_id, job in self.jobs.items())


@dataclass(frozen=True)
class ChangedRows:
    """The job rows changed since a horizon, and the horizon to read the next changes
    from."""

    horizon: str
    rows: dict[str, JobRow]


class JobRowStore(StoreBase):
    """The reads of a schedule's job rows (part of JobStore)."""

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
                    row.retired,
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

    async def load(self, job_ids: Iterable[str]) -> dict[str, JobRow]:
        """The stored next slot, pause flag, run-now request and leader_only of each job."""
        async with self.engine.connect() as conn:
            result = await conn.execute(_LOAD, {"ids": list(job_ids), "schedule": self.schedule})
            return {row.id: JobRow.of(row) for row in result}
