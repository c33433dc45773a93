"""Run one fire of one job, the way the leader would, and return what it recorded."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import datetime
from zoneinfo import ZoneInfo

from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.outbox import Outbox
from app.scheduler import Clock, FakeClock, Scheduler, SchedulerError
from app.scheduler.clock import lease_clock
from app.scheduler.runner import Runner
from app.scheduler.store import JobStore
from app.settings import load_settings

from .claims import claim_request

__all__ = ["RunRecord", "run_job"]

_REQUEST = text(
    "UPDATE scheduler_jobs SET run_requested_at = :now WHERE schedule = :schedule AND id = :job_id"
)
_RUN = text(
    "SELECT id, slot, status, error, duration_ms, started_at, finished_at"
    " FROM scheduler_runs WHERE id = :run_id"
)


@dataclass(frozen=True)
class RunRecord:
    """One run as the history table holds it."""

    run_id: int
    slot: datetime
    status: str
    error: str | None
    duration_ms: int | None
    started_at: datetime
    finished_at: datetime | None


async def run_job(
    scheduler: Scheduler,
    job_id: str,
    *,
    database: Database,
    at: datetime | None = None,
    clock: Clock | None = None,
    zone: ZoneInfo | None = None,
) -> RunRecord:
    """Fire ``job_id`` once, at ``at``, through the real claim and runner.

    The job's row is registered as a leader would register it and the run is asked for
    as run-now asks for it: a request at ``at`` (default: the clock's now), claimed and
    run at once, recorded as a manual run; the job's next slot stays where the schedule
    put it. The body sees ``ctx.scheduled_at == at`` and ``ctx.clock`` is ``clock`` (a
    FakeClock set to ``at`` when none is given). The scheduler's outboxes are bound to
    ``database`` and ``clock`` first, as the app binds them at start-up, so a message
    the body queues is due at ``at`` and a later drain(..., clock=FakeClock(later))
    finds its retry due.
    A per-worker job (``leader_only=False``) runs as a worker would run it, unclaimed.
    No leadership is taken: the claim takes the leadership term current in the
    database (0 when no leader was ever recorded), so ``ctx.fence`` passes unless a
    promotion happens while the body runs, as it would fail a real stale run.
    Returns the run's record; a body that raised is ``status == "error"``, not an
    exception here; a run refused because another body of the job still runs is
    ``"skipped_overlap"``.
    The job is the one of the schedule the app would run it in: the name the
    Scheduler is given in code, else the one it was started with, else SCHEDULER_NAME
    (read as the app reads its settings).
    Raises SchedulerError for an unknown job id, or when the claim matched nothing
    (the job is paused), and SettingsError for a bad SCHEDULER_NAME.
    """
    spec = scheduler.jobs.get(job_id)
    if spec is None:
        raise SchedulerError(
            f"no job {job_id!r} on this scheduler; it has {sorted(scheduler.jobs)}"
        )
    if clock is None:
        clock = FakeClock(at) if at is not None else FakeClock()
    elif at is not None and isinstance(clock, FakeClock):
        clock.set(at)
    now = at or clock.now()
    zone = zone or ZoneInfo("UTC")
    for outbox in Outbox.live():
        if outbox.scheduler is scheduler:
            outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database.url), clock=clock)
    schedule = scheduler.name if scheduler.name_is_set else load_settings().SCHEDULER_NAME
    store = JobStore(
        database.engine,
        pid=os.getpid(),
        host=socket.gethostname(),
        lease_clock=lease_clock(clock),
        schedule=schedule,
    )
    runner = Runner(
        store,
        clock=clock,
        zone=zone,
        sessions=database.sessions,
        sync_sessions=database.sync_sessions,
        observers=scheduler.observers,
    )
    if spec.leader_only:
        await store.register_leader_jobs([spec], now, zone)
        async with database.engine.begin() as conn:
            await conn.execute(_REQUEST, {"now": now, "job_id": job_id, "schedule": schedule})
        claim = await claim_request(runner, spec, now, None)
        if claim is None:
            raise SchedulerError(f"job {job_id!r} could not be claimed: is it paused?")
        if claim.runs:
            await runner.execute(spec, claim)
        run_id = claim.run_id
    else:
        await store.register_replica_jobs([spec], now, zone)
        run_id = await runner.fire_replica(spec, now)
    async with database.engine.connect() as conn:
        row = (await conn.execute(_RUN, {"run_id": run_id})).one()
    return RunRecord(
        run_id=row.id,
        slot=row.slot,
        status=row.status,
        error=row.error,
        duration_ms=row.duration_ms,
        started_at=row.started_at,
        finished_at=row.finished_at,
    )
