"""The admin JSON API under /admin/api, behind the admin dependency."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Security
from fastapi.responses import JSONResponse

from app.db import Database
from app.http_errors import SafeJSONResponse, error_response
from app.scheduler import Clock, Scheduler
from app.scheduler.clock import lease_now
from app.storable import INT64_MAX

from ..operations import display, leadership
from ..operations.errors import AdminError
from ..operations.jobs import forget_job, list_jobs, run_job_now, set_paused
from ..operations.messages import outbox_messages, reset_outbox_message
from ..operations.outboxes import forget_outbox, list_outboxes, reset_all_stuck
from ..operations.run_status import RunStatus
from ..operations.runs import job_runs
from .auth import bearer_scheme, guard_responses, require_admin
from .params import JobId, MessageId, OutboxName

__all__ = ["admin_error_response", "engine_of", "lease_now_of", "router", "schedule_name"]

router = APIRouter(
    prefix="/admin/api",
    tags=["admin"],
    dependencies=[Security(bearer_scheme("ADMIN_TOKEN")), Depends(require_admin)],
    responses=guard_responses("ADMIN_TOKEN"),
)

# What a route naming a job or a message answers besides the guard's own refusals.
Responses = dict[int | str, dict[str, Any]]
_UNKNOWN_JOB: Responses = {
    404: error_response("ADMIN_TOKEN is unset, or no job of that id in this schedule")
}
_UNKNOWN_OUTBOX: Responses = {
    404: error_response("ADMIN_TOKEN is unset, or no outbox of that name")
}
_UNKNOWN_MESSAGE: Responses = {
    404: error_response("ADMIN_TOKEN is unset, or no outbox of that name or message of that id")
}
_RETIRED_OR_HELD = error_response(
    "the job is retired (the message names `jobs forget`, which removes it); or its row "
    "stayed held by another transaction past the wait (the message names its backend "
    "pid)"
)


def engine_of(request: Request) -> Any:
    """The app's async engine (its Database's), which every admin view reads through."""
    database: Database = request.app.state.database
    return database.engine


def schedule_name(request: Request) -> str:
    """The name of the schedule this app runs (app/scheduler/keys.py): its scheduler's,
    else SCHEDULER_NAME. The admin views read and change only that schedule's rows."""
    scheduler: Scheduler | None = request.app.state.scheduler
    if scheduler is not None:
        return scheduler.name
    name: str = request.app.state.settings.SCHEDULER_NAME
    return name


def lease_now_of(request: Request) -> datetime | None:
    """The lease clock's now for this app (clock.lease_now): None, the database
    server's clock, which every lease and due time is written and compared on."""
    clock: Clock = request.app.state.clock
    return lease_now(clock)


async def admin_error_response(request: Request, exc: Exception) -> JSONResponse:
    """AdminError -> its status with the message as ``detail``."""
    assert isinstance(exc, AdminError)
    return SafeJSONResponse({"detail": str(exc)}, status_code=exc.status)


@router.get("/jobs")
async def jobs(
    request: Request,
    retired: Annotated[
        bool, Query(description="list retired jobs too (no longer registered: see retired_at)")
    ] = False,
) -> list[dict[str, Any]]:
    """Every job: schedule (``trigger`` as stored, ``trigger_description`` as a human
    reads it with the zone named), last start and finish, status, duration, lateness,
    running (a running lease holds, the job's or one of its per-worker runs', on the
    database's clock), paused, broken (with the error), stored (false for a broken job
    that has no row yet: its run-now, pause and runs answer 404), and for a due slot or
    run-now request no claim has taken yet ``unclaimed_since``, ``unclaimed_seconds``
    (on the database's clock) and ``held_by`` (the backend whose transaction holds the
    job's row, which the leader's claim leaves out until it is free). A job the
    schedule's leader no longer registers is retired (``retired_at``): it fires no more
    and is listed only with ``retired=true``."""
    zone = request.app.state.settings.TIMEZONE
    return [
        job | {"trigger_description": display.trigger(job["trigger"], zone)}
        for job in await list_jobs(
            engine_of(request),
            lease_now_of(request),
            schedule=schedule_name(request),
            retired=retired,
        )
    ]


@router.get("/jobs/{job_id}/runs", responses=_UNKNOWN_JOB)
async def runs(
    request: Request,
    job_id: JobId,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[
        int | None, Query(ge=1, le=INT64_MAX, description="id of the last run seen")
    ] = None,
    status: Annotated[RunStatus | None, Query(description="only the runs of this status")] = None,
) -> dict[str, Any]:
    """A page of the run history, newest first (only the runs of ``status`` when it is
    given; 422 naming the statuses for one no run can have); pass ``next_before`` to get
    the next.
    ``manual`` marks a run an operator asked for; ``error_summary`` is the line of
    ``error`` that says what went wrong."""
    page = [
        run | {"error_summary": display.error_summary(run["error"])}
        for run in await job_runs(
            engine_of(request),
            job_id,
            limit=limit,
            before=before,
            schedule=schedule_name(request),
            status=status,
        )
    ]
    next_before = page[-1]["id"] if len(page) == limit else None
    return {"runs": page, "next_before": next_before}


@router.post(
    "/jobs/{job_id}/run",
    status_code=202,
    responses=_UNKNOWN_JOB
    | {
        409: error_response(
            "the job is running, paused, retired or per-worker; or its row stayed held "
            "past the wait"
        )
    },
)
async def run_now(request: Request, job_id: JobId) -> dict[str, str]:
    """Fire now, through the same slot claim; 409 while the job runs (its running lease
    holds), while it is paused, for a retired job (forget it instead), and for a
    per-worker job (each worker runs that on its own schedule)."""
    await run_job_now(
        engine_of(request),
        job_id,
        lease_now=lease_now_of(request),
        schedule=schedule_name(request),
    )
    return {"status": "queued"}


@router.delete(
    "/jobs/{job_id}",
    responses=_UNKNOWN_JOB
    | {
        409: error_response(
            "the job is still registered by its schedule's leader, or running; or its row "
            "stayed held past the wait"
        )
    },
)
async def forget(request: Request, job_id: JobId) -> dict[str, Any]:
    """Forget a retired job: its row and its whole run history are deleted. 409 for a
    job its schedule's leader still registers (remove it from the code first)."""
    runs = await forget_job(engine_of(request), job_id, schedule=schedule_name(request))
    return {"status": "forgotten", "runs_deleted": runs}


@router.post("/jobs/{job_id}/pause", responses=_UNKNOWN_JOB | {409: _RETIRED_OR_HELD})
async def pause(request: Request, job_id: JobId) -> dict[str, str]:
    """Pause the job: no slot is claimed (per-worker jobs: no worker runs a slot) until
    it is resumed. 409 for a retired job (forget it instead)."""
    await set_paused(engine_of(request), job_id, True, schedule=schedule_name(request))
    return {"status": "paused"}


@router.post("/jobs/{job_id}/resume", responses=_UNKNOWN_JOB | {409: _RETIRED_OR_HELD})
async def resume(request: Request, job_id: JobId) -> dict[str, str]:
    """Resume a paused job. 409 for a retired job (forget it instead)."""
    await set_paused(engine_of(request), job_id, False, schedule=schedule_name(request))
    return {"status": "resumed"}


@router.get("/leader")
async def leader(request: Request) -> dict[str, Any]:
    """The schedule's name and its key holder's pid, application_name, host, since when
    and the jobs it fires; the standbys waiting: ``standbys`` in all,
    ``standbys_on_key`` (sessions waiting for the key) and ``standbys_behind_host_lock``
    (workers waiting for their host's lock file)."""
    return await leadership.leader(
        engine_of(request), lease_now=lease_now_of(request), schedule=schedule_name(request)
    )


@router.get("/outboxes")
async def outboxes(
    request: Request,
    retired: Annotated[
        bool, Query(description="list retired outboxes too (no app drains them: see retired)")
    ] = False,
) -> list[dict[str, Any]]:
    """Each outbox: counts by status (scheduled: delayed messages not yet due), oldest
    pending age, last drain, the schedule that claimed its name. An outbox no app
    drains any more (its drain job retired, or forgotten) is ``retired`` (with its drain
    job's ``retired_at``) and listed only with ``retired=true``."""
    return await list_outboxes(engine_of(request), lease_now_of(request), retired=retired)


@router.delete(
    "/outboxes/{name}",
    responses=_UNKNOWN_OUTBOX
    | {
        409: error_response(
            "an app still drains the outbox, a drain's claim on one of its rows still runs, "
            "or its rows stayed held by another transaction past the wait"
        )
    },
)
async def forget_outbox_rows(request: Request, name: OutboxName) -> dict[str, Any]:
    """Forget a retired outbox: its messages, drain record and name's claim are
    deleted. 404 unknown; 409 while an app drains it (remove it from the code first),
    while a drain still delivers one of its rows, or for an outbox no schedule
    claimed."""
    messages = await forget_outbox(engine_of(request), name)
    return {"status": "forgotten", "messages_deleted": messages}


@router.get("/outboxes/{name}/messages", responses=_UNKNOWN_OUTBOX)
async def messages(
    request: Request,
    name: OutboxName,
    status: Literal["stuck", "pending", "scheduled"] = "stuck",
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> list[dict[str, Any]]:
    """The stuck (default) or pending rows of an outbox, with attempts and last error,
    or its scheduled rows (delayed messages not yet due) with their ``deliver_at``."""
    return await outbox_messages(
        engine_of(request), name, status=status, limit=limit, lease_now=lease_now_of(request)
    )


@router.post(
    "/outboxes/{name}/messages/{message_id}/reset",
    responses=_UNKNOWN_MESSAGE
    | {
        409: error_response(
            "the message is delivered, or a drain is delivering it, or its row stayed held "
            "past the wait"
        )
    },
)
async def reset(request: Request, name: OutboxName, message_id: MessageId) -> dict[str, str]:
    """Set the row pending, attempts 0, due now; 404 unknown, 409 delivered or held by
    a drain that is delivering it."""
    await reset_outbox_message(engine_of(request), name, message_id, lease_now_of(request))
    return {"status": "pending"}


@router.post("/outboxes/{name}/reset-stuck", responses=_UNKNOWN_OUTBOX)
async def reset_stuck(request: Request, name: OutboxName) -> dict[str, int]:
    """Set every stuck row of the outbox pending, attempts 0, due now, in one
    statement: ``reset`` counts them; ``held`` counts the stuck rows another
    transaction held, left alone (never waited on; reset again once it has ended).
    404 for an unknown outbox."""
    return await reset_all_stuck(engine_of(request), name, lease_now_of(request))
