"""Report warm: an expensive aggregate computed by a job, read by GET /api/stats.

A read endpoint people poll is a job, not a request: the aggregate runs once per
REPORT_WARM_INTERVAL_MINUTES (first 30 s after the first boot), one commit per
workspace, and the endpoint reads one row. ``build()`` in ``app.jobs`` mounts it behind
``Authorization: Bearer <API_TOKEN>`` (see api_token.py): it reads any workspace.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.db import Database
from app.http_errors import error_response
from app.scheduler import JobContext, Scheduler, every
from app.storable_types import Int32Id

__all__ = ["Stats", "register", "router", "warm_report_stats"]

_WORKSPACES = text("SELECT id FROM workspaces ORDER BY id")
_COMPUTE = text(
    """
    INSERT INTO report_stats (workspace_id, events_30d, upcoming_bookings, computed_at)
    SELECT :workspace_id,
        (SELECT count(*) FROM tracking_events
         WHERE workspace_id = :workspace_id AND occurred_at >= :since),
        (SELECT count(*) FROM bookings WHERE workspace_id = :workspace_id AND starts_at > :now),
        :now
    ON CONFLICT (workspace_id) DO UPDATE SET
        events_30d = excluded.events_30d, upcoming_bookings = excluded.upcoming_bookings,
        computed_at = excluded.computed_at
    """
)
_READ = text(
    "SELECT events_30d, upcoming_bookings, computed_at FROM report_stats"
    " WHERE workspace_id = :workspace_id"
)


class Stats(BaseModel):
    """A workspace's warmed statistics and when they were computed."""

    workspace_id: int
    events_30d: int
    upcoming_bookings: int
    computed_at: datetime


async def warm_report_stats(session: AsyncSession, now: datetime) -> int:
    """Recompute every workspace's stats, one commit each; return how many."""
    async with session.begin():
        workspace_ids = list((await session.execute(_WORKSPACES)).scalars())
    for workspace_id in workspace_ids:
        async with session.begin():
            await session.execute(
                _COMPUTE,
                {"workspace_id": workspace_id, "now": now, "since": now - timedelta(days=30)},
            )
    return len(workspace_ids)


def register(scheduler: Scheduler, interval_minutes: float) -> None:
    """Every ``interval_minutes``, first 30 s after the first boot: "Warm report statistics"."""

    @scheduler.job(
        every(minutes=interval_minutes),
        id="report_warm",
        name="Warm report statistics",
        first_run=30,
    )
    async def report_warm(ctx: JobContext) -> None:
        await warm_report_stats(ctx.session, ctx.clock.now())


router = APIRouter(prefix="/api", tags=["stats"])


@router.get(
    "/stats",
    response_model=Stats,
    responses={
        404: error_response("API_TOKEN is unset, or no stats of that workspace_id computed yet")
    },
)
async def read_stats(request: Request, workspace_id: Annotated[Int32Id, Query()]) -> Stats:
    """The warmed stats of a workspace; 404 until the warm job has computed them."""
    database: Database = request.app.state.database
    async with database.sessions() as session:
        row = (await session.execute(_READ, {"workspace_id": workspace_id})).first()
    if row is None:
        raise HTTPException(
            404, f"no stats for workspace_id {workspace_id} yet; the report_warm job computes them"
        )
    return Stats(workspace_id=workspace_id, **row._asdict())
