"""A leadership's registration of its job rows, at its promotion."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from ..invocation import program
from .broken import BrokenJobs
from .faults import blames_job, is_busy_row
from .registry import JobSpec
from .store import JobRow, JobStore, LeaderRow, StoredJobs, format_error
from .triggers import Trigger

__all__ = ["Registered", "refresh_statistics", "register_leader_rows", "settle_retirement"]

logger = logging.getLogger("app.scheduler")

# A registration that inserts at least this many job rows, more than the schedule held,
# has the planner count them (refresh_statistics); for fewer, a claim that reads every
# row costs about what its index probes would.
_GREW_ROWS = 1000


@dataclass(frozen=True)
class Registered:
    """What a registration read and wrote: the rows of the jobs registered, the horizon
    where the first tick's look for changes starts, whether it grew the schedule
    enough that the planner should count its rows, and every row as it was read."""

    rows: dict[str, JobRow]
    horizon: str
    grew: bool
    stored: StoredJobs


async def register_leader_rows(
    leader_jobs: list[JobSpec],
    *,
    store: JobStore,
    broken: BrokenJobs,
    zone: ZoneInfo,
    now: datetime,
) -> Registered:
    """Read every job row of the schedule, and upsert in one statement the rows of
    the leader jobs that are not stored as registered (no row, another trigger or
    name, not leader-only): a failover over unchanged jobs writes nothing. When that
    statement fails for a job's fault, each row is written in its own commit
    instead, so the job whose row or first slot cannot be handled is marked broken
    (its loop retries it) and every other job registers; a database that does not
    answer fails the whole leadership, to be retried. Clears the broken marks of
    the jobs registered. ``grew`` when it inserted at least _GREW_ROWS rows, more
    than the schedule held."""
    registered: dict[str, JobRow] = {}
    specs = {spec.id: spec for spec in leader_jobs}
    stored = await store.stored_jobs()
    rows: list[LeaderRow] = []
    first_slots: dict[Trigger, datetime] = {}
    for spec in specs.values():
        held = stored.jobs.get(spec.id)
        try:
            trigger = spec.trigger.describe()
            if (
                held is not None
                and held.leader_only
                and held.trigger == trigger
                and held.name == spec.name
            ):
                # Stored as registered: nothing to write, and its state is the one read.
                registered[spec.id] = held.row
                continue
            rows.append(
                LeaderRow.of(
                    spec,
                    now,
                    zone,
                    stored_trigger=None if held is None else held.trigger,
                    first_slots=first_slots,
                )
            )
        except Exception as exc:
            await _blame(store, broken, spec.id, exc)
    try:
        written = await store.upsert_leader_rows(rows)
        registered |= written
        # Rows given without slots whose stored row changed since it was read.
        changed = [specs[row.id] for row in rows if row.id not in written]
        registered |= await store.register_leader_jobs(changed, now, zone)
    except Exception as exc:
        if not await blames_job(store.engine, exc):
            raise
        logger.warning(
            "scheduler.register_one_by_one: the set registration of %s jobs failed (%s); "
            "registering each in its own commit",
            len(rows),
            exc.__class__.__name__,
            extra={"action": "scheduler.register_one_by_one", "pid": os.getpid()},
        )
        for row in rows:
            if row.id in registered:
                continue
            try:
                # With its slots: the stored row read above may have changed since.
                registered[row.id] = await store.register_leader_job(specs[row.id], now, zone)
            except Exception as row_exc:
                await _blame(store, broken, row.id, row_exc)
    repaired = (stored.broken | broken.ids) & registered.keys()
    if repaired:
        await broken.repaired(sorted(repaired))
    inserted = sum(1 for row in rows if row.id in registered and row.id not in stored.jobs)
    grew = inserted >= _GREW_ROWS and inserted > len(stored.jobs)
    return Registered(registered, stored.horizon, grew, stored)


async def settle_retirement(store: JobStore, job_ids: Iterable[str], read: StoredJobs) -> None:
    """Retire the job rows of the schedule that the promoted leader's registry
    (``job_ids``, per-worker jobs included) no longer has (a job removed from the code
    or renamed), and bring back the retired ones it has again, their history intact.
    No registry claims a retired job, so it fires no more; the listing hides it unless
    asked; its history stays until an operator forgets it. Logged as
    ``scheduler.jobs_retired`` and ``scheduler.jobs_returned``. Writes nothing when
    the rows as the registration ``read`` them show no mark wrong (a failover of an
    unchanged release): a row another release inserted since is settled by the next
    promotion, as a row held elsewhere is."""
    job_ids = list(job_ids)
    if not read.retirement_wrong(job_ids):
        return
    retired, returned = await store.settle_retirement(job_ids)
    pid = os.getpid()
    if retired:
        logger.info(
            "scheduler.jobs_retired: %s no longer registered by this release; listed with "
            "`%s jobs --all`, forgotten with `%s jobs forget ID` (pid=%s)",
            ", ".join(retired),
            program(),
            program(),
            pid,
            extra={"action": "scheduler.jobs_retired", "job_ids": retired, "pid": pid},
        )
    if returned:
        logger.info(
            "scheduler.jobs_returned: %s registered again, with their history (pid=%s)",
            ", ".join(returned),
            pid,
            extra={"action": "scheduler.jobs_returned", "job_ids": returned, "pid": pid},
        )


async def refresh_statistics(store: JobStore) -> None:
    """Have the planner count the job rows a registration just inserted. Until the
    autovacuum's analyze (up to a minute later) it plans for the rows the table
    held, and its plan of the slot claim reads every job row of the schedule at
    each fire: with 10,000 new jobs, each fire of the first minute after a first
    boot waited on a scan of them all. Never raises."""
    try:
        await store.analyze()
    except Exception:
        logger.warning("scheduler: could not analyze the job rows", exc_info=True)


async def _blame(store: JobStore, broken: BrokenJobs, job_id: str, exc: BaseException) -> None:
    """Mark the job broken for ``exc``; re-raise it when the database does not
    answer (an outage, not the job's fault). A row another transaction holds is
    neither: the job is left unregistered, and the timer registers it once the row
    is free (JobTimer's late registration)."""
    if is_busy_row(exc):
        return
    if not await blames_job(store.engine, exc):
        raise exc
    await broken.mark(job_id, format_error(exc))
