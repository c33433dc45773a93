"""GET /health/scheduler: does the schedule fire? No authentication; job ids only.

200 when all of these hold, 503 naming what failed otherwise:

- this worker's scheduler was not refused at start (``refusal``: why it was, e.g. a
  schedule name whose key collides with another name's, see app/scheduler/keys.py);
- a process holds the leader key of this schedule (``leader``); a key that
  scheduler_schedules gives to another name is not this schedule's;
- that leader fires (``firing``): it has registered its jobs and started its job timer
  (the leadership row names its lock backend) and its tick said so within one lease.
  A handover that never ends or a leader whose tick is stuck is not firing;
- no job of this app is broken (``broken_jobs``): the leader could not handle its row
  or next slot, or its job timer died;
- every leader-only job and every service of this app is run by the leader of its
  schedule (``jobs_not_led``, their ids): another app of the same schedule name may
  lead with another set, and then this app's extra ones run nowhere;
- no due slot or run-now request of a leader-only job (not paused) has gone unclaimed
  for longer than a leader tick plus the handover grace after it fires (a slot fires
  its jitter after it) (``unclaimed_jobs``), read from the job rows on the lease clock
  (the database's), not from the leader's heartbeat: a job whose row another
  transaction holds is left out of the claims while every other job fires, and so is
  every job of a leader that froze. The tick is how soon the leader tries again a slot
  it could not claim; the handover grace is how long a new leader waits before its
  first claim (HANDOVER_GRACE_SECONDS). A slot that comes while the job's body still
  runs is claimed as skipped_overlap, so a long body is not unclaimed;
- no leader-only job (not paused) is stale (``stale_jobs``): each must have succeeded
  since the slot before its last due slot, and at most ``GRACE_FLOOR`` before that
  last slot. The allowed age follows the job's own schedule, so a weekday cron is not
  stale on a weekend. A job never succeeded counts from its registration.

Keyed on job id, never on the name (a renamed job is not a phantom alert). Everything
is read for this app's schedule (``schedule``, app/scheduler/keys.py) only.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from app.scheduler import Scheduler, Trigger
from app.settings import Settings

from ..operations.display import is_never
from ..operations.jobs import list_jobs
from ..operations.leadership import leader
from ..operations.reading import lease_clock_now
from .api import engine_of, lease_now_of, schedule_name

__all__ = ["SchedulerHealth", "last_due_slots", "router", "stale_jobs", "unclaimed_jobs"]

router = APIRouter(tags=["health"])

GRACE_FLOOR = timedelta(minutes=10)


class SchedulerHealth(BaseModel):
    """The body of GET /health/scheduler, 200 and 503 alike (see the module docstring)."""

    status: Literal["ok", "unhealthy"]
    schedule: str
    refusal: str | None
    leader: bool
    firing: bool
    broken_jobs: list[str]
    unclaimed_jobs: list[str]
    stale_jobs: list[str]
    jobs_not_led: list[str]


def last_due_slots(
    trigger: Trigger, next_slot: datetime, now: datetime, zone: Any
) -> tuple[datetime, datetime] | None:
    """The last slot at or before ``now`` and the one before it, found from the job's
    next slot (the row's stored next run); None when no slot before ``next_slot`` has
    come yet (a ``first_run`` placed it, or the trigger changed)."""
    if next_slot > now:
        latest = trigger.previous_slot(next_slot, zone)
        if latest > now:
            return None
    else:
        latest, _ = trigger.latest_slot(next_slot, now, zone)
    return latest, trigger.previous_slot(latest, zone)


def stale_jobs(
    scheduler: Scheduler, rows: list[dict[str, Any]], now: datetime, zone: Any
) -> list[str]:
    """Ids of the leader-only jobs that have not succeeded since the slot before their
    last due slot (see the module docstring)."""
    stale = []
    by_id = {row["id"]: row for row in rows}
    for spec in scheduler.jobs.values():
        row = by_id.get(spec.id)
        # A broken job is reported as broken; its trigger may be what raises.
        if not spec.leader_only or row is None or row["paused"] or row.get("broken"):
            continue
        if row.get("next_run_at") is not None and is_never(row["next_run_at"]):
            # An operator's 'infinity': it has no slot to miss.
            continue
        try:
            anchor = row.get("next_run_at") or spec.trigger.next_after(now, zone)
            due = last_due_slots(spec.trigger, anchor, now, zone)
        except Exception:
            # Health cannot vouch for a job whose slots it cannot compute.
            stale.append(spec.id)
            continue
        if due is None:
            continue
        latest, before = due
        last = row["last_success_at"] or row["created_at"]
        if last < min(before, latest - GRACE_FLOOR):
            stale.append(spec.id)
    return stale


def unclaimed_jobs(
    scheduler: Scheduler, rows: list[dict[str, Any]], allowed: timedelta
) -> list[str]:
    """Ids of this app's leader-only jobs whose due slot or run-now request no claim
    has taken for longer than ``allowed`` (a leader tick plus the handover grace) after
    it fires: a slot its jitter after it, a request at once. ``rows`` as
    jobs.list_jobs gives them, read on the lease clock. A broken job is reported as
    broken."""
    unclaimed = []
    by_id = {row["id"]: row for row in rows}
    for spec in scheduler.jobs.values():
        row = by_id.get(spec.id)
        if not spec.leader_only or row is None or row.get("broken"):
            continue
        if row.get("unclaimed_seconds") is None:
            continue
        waited = timedelta(seconds=row["unclaimed_seconds"])
        if row["unclaimed_since"] == row["next_run_at"]:
            waited -= timedelta(seconds=spec.jitter_delay(row["next_run_at"]))
        if waited > allowed:
            unclaimed.append(spec.id)
    return unclaimed


def _firing(holder: dict[str, Any], lease: timedelta) -> bool:
    """True when the key holder's leadership row is its own and its tick is fresh: the
    heartbeat's age on the lease clock (the database's), on which the leader writes it,
    so neither the leader's clock nor this reader's decides."""
    age = holder["heartbeat_age_seconds"]
    return age is not None and age <= lease.total_seconds()


def _not_led(scheduler: Scheduler, holder: dict[str, Any]) -> list[str]:
    """Ids of this app's leader-only jobs and services that the firing leader of its
    schedule did not record among the ones it runs: they run nowhere while it leads. A
    leader of a release that records no services (``service_ids`` NULL) vouches for
    none and is blamed for none."""
    led = set(holder["job_ids"] or ())
    jobs = {spec.id for spec in scheduler.jobs.values() if spec.leader_only} - led
    services = set()
    if holder["service_ids"] is not None:
        services = set(scheduler.services) - set(holder["service_ids"])
    return sorted(jobs | services)


@router.get(
    "/health/scheduler",
    responses={
        200: {"model": SchedulerHealth, "description": "the schedule fires"},
        503: {"model": SchedulerHealth, "description": "what fails, named in the body"},
    },
)
async def scheduler_health(request: Request) -> JSONResponse:
    """200 with a firing leader and no broken, unclaimed or stale job; 503 with the
    reasons."""
    engine = engine_of(request)
    scheduler: Scheduler | None = request.app.state.scheduler
    settings: Settings = request.app.state.settings
    schedule = schedule_name(request)
    # Whether a slot is stale is a due comparison: on the lease clock, not this host's.
    now = await lease_clock_now(engine, lease_now_of(request))
    holder = await leader(engine, lease_now=lease_now_of(request), schedule=schedule)
    rows = await list_jobs(engine, lease_now_of(request), schedule=schedule)
    zone = request.app.state.zone
    stale = stale_jobs(scheduler, rows, now, zone) if scheduler is not None else []
    allowed = timedelta(seconds=settings.LEADER_TICK_SECONDS + settings.HANDOVER_GRACE_SECONDS)
    unclaimed = unclaimed_jobs(scheduler, rows, allowed) if scheduler is not None else []
    ours = set(scheduler.jobs) if scheduler is not None else set()
    broken = [row["id"] for row in rows if row["broken"] and row["id"] in ours]
    leads = holder["backend_pid"] is not None
    firing = leads and _firing(holder, timedelta(seconds=settings.LEASE_SECONDS))
    unled = _not_led(scheduler, holder) if firing and scheduler is not None else []
    supervisor = scheduler.supervisor if scheduler is not None else None
    refusal = supervisor.refusal if supervisor is not None else None
    healthy = (
        firing and not stale and not broken and not unclaimed and not unled and refusal is None
    )
    body = SchedulerHealth(
        status="ok" if healthy else "unhealthy",
        schedule=schedule,
        refusal=refusal,
        leader=leads,
        firing=firing,
        broken_jobs=broken,
        unclaimed_jobs=unclaimed,
        stale_jobs=stale,
        jobs_not_led=unled,
    )
    return JSONResponse(body.model_dump(), status_code=200 if healthy else 503)
