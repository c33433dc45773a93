"""GET /health/scheduler: is the schedule alive? No authentication; job ids only.

200 when a process holds the leader key and every leader-only job (not paused) has
succeeded within its interval plus one interval of grace, the grace floored at 10
minutes; 503 listing the stale job ids otherwise. Keyed on job id, never on the name
(a renamed job is not a phantom alert).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.db import Database
from app.scheduler import Clock, Scheduler, Trigger

from . import queries

__all__ = ["interval_of", "router", "stale_jobs"]

router = APIRouter(tags=["health"])

GRACE_FLOOR = timedelta(minutes=10)


def interval_of(trigger: Trigger, now: datetime, zone: Any) -> timedelta:
    """The gap between a trigger's next two slots: its interval as operators mean it."""
    first = trigger.next_after(now, zone)
    return trigger.next_after(first, zone) - first


def stale_jobs(
    scheduler: Scheduler, rows: list[dict[str, Any]], now: datetime, zone: Any
) -> list[str]:
    """Ids of the leader-only jobs whose last success (or registration) is too old."""
    stale = []
    by_id = {row["id"]: row for row in rows}
    for spec in scheduler.jobs.values():
        row = by_id.get(spec.id)
        if not spec.leader_only or row is None or row["paused"]:
            continue
        interval = interval_of(spec.trigger, now, zone)
        allowed = interval + max(interval, GRACE_FLOOR)
        last = row["last_success_at"] or row["created_at"]
        if now - last > allowed:
            stale.append(spec.id)
    return stale


@router.get("/health/scheduler")
async def scheduler_health(request: Request) -> JSONResponse:
    """200 with a live leader and no stale job; 503 with the reasons otherwise."""
    database: Database = request.app.state.database
    scheduler: Scheduler | None = request.app.state.scheduler
    clock: Clock = request.app.state.clock
    now = clock.now()
    holder = await queries.leader(database.engine)
    rows = await queries.list_jobs(database.engine)
    zone = request.app.state.zone
    stale = stale_jobs(scheduler, rows, now, zone) if scheduler is not None else []
    healthy = holder["backend_pid"] is not None and not stale
    body = {
        "status": "ok" if healthy else "unhealthy",
        "leader": holder["backend_pid"] is not None,
        "stale_jobs": stale,
    }
    return JSONResponse(body, status_code=200 if healthy else 503)
