"""The admin page: server-rendered HTML, no JavaScript build.

The main page shows the leader, the jobs, the outboxes and their pending and stuck
rows; each job has a page with its history, paged by ``before=<run id>``. Both refresh
themselves (a meta refresh to the same view without its flash) and read values the
way the CLI prints them (see display.py).

Sign-in posts the token once; the page then keeps an HttpOnly, SameSite=Strict session
cookie that carries its issue time and is signed with the token (never the token
itself); sign-out revokes it everywhere (see session.py). Every POST carries a CSRF
field derived from the session, and the sign-in one derived from the form's own cookie.
Repeated wrong tokens from one client are slowed, the right one never (see
throttle.py). Without ADMIN_TOKEN every route here answers 404.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from app.db import Database
from app.storable import INT64_MAX

from . import chart, display, outboxes, queries, session
from .api import lease_now_of, schedule_name
from .auth import admin_key, refuse_wrong_token, token_matches
from .errors import AdminError, NotFound
from .params import JobId, MessageId, OutboxName
from .run_status import RUN_STATUSES, RunStatus

__all__ = ["router"]

router = APIRouter(prefix="/admin", include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
templates.env.globals["display"] = display

_FLASH = re.compile(r"^(reset|run|pause|resume|forget|forgetoutbox)-([A-Za-z0-9_.:-]{1,200})$")
_FLASHES = {
    "reset": "Message {} is pending again and due now.",
    "run": "Job {} is queued to run now.",
    "pause": "Job {} is paused.",
    "resume": "Job {} is resumed.",
    "forget": "Job {} is forgotten, with its history.",
    "forgetoutbox": "Outbox {} is forgotten, with its messages.",
}
# A bulk reset's flash carries its counts: rows reset, rows held, the outbox.
_RESET_STUCK_FLASH = re.compile(r"^resetstuck-([0-9]{1,19})-([0-9]{1,19})-([A-Za-z0-9_]{1,200})$")
# Seconds between the page's own reloads: fresh enough to watch a run, calm enough to read.
REFRESH_SECONDS = 30
_PENDING_SHOWN = 50


def _key(request: Request) -> bytes:
    key = admin_key(request.app.state.settings)
    if key is None:
        raise HTTPException(404, "Not Found")
    return key


def _engine(request: Request) -> Any:
    database: Database = request.app.state.database
    return database.engine


async def _session(request: Request, key: bytes) -> str | None:
    """The request's session cookie when it is signed, unexpired and not revoked."""
    cookie = request.cookies.get(session.COOKIE)
    issued = session.issued_at(key, cookie)
    if cookie is None or issued is None:
        return None
    if not await session.is_current(_engine(request), issued, lease_now_of(request)):
        return None
    return cookie


def _check_csrf(key: bytes, cookie: str, offered: str) -> None:
    expected = session.csrf_for(key, cookie)
    if not hmac.compare_digest(offered.encode("utf-8", "replace"), expected.encode()):
        raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page")


def _flash(code: str | None) -> str | None:
    counted = _RESET_STUCK_FLASH.match(code or "")
    if counted is not None:
        reset, held, name = counted.groups()
        told = f"{reset} stuck message(s) of outbox {name} are pending again and due now."
        if held != "0":
            told += f" {held} held by another transaction were left stuck; reset them again."
        return told
    match = _FLASH.match(code or "")
    if match is None:
        return None
    action, subject = match.groups()
    return _FLASHES[action].format(subject)


async def _common(
    request: Request, csrf: str, flash: str | None, refresh_url: str, failed: bool = False
) -> dict[str, Any]:
    return {
        "csrf": csrf,
        "flash": flash,
        "failed": failed,
        # "in 14 min" is told on the clock the times shown are on, not this host's.
        "now": await queries.lease_clock_now(_engine(request), lease_now_of(request)),
        "zone": request.app.state.settings.TIMEZONE,
        "refresh_url": refresh_url,
        "refresh_seconds": REFRESH_SECONDS,
    }


async def _page(
    request: Request, csrf: str, flash: str | None, status_code: int = 200
) -> HTMLResponse:
    engine = _engine(request)
    listed = await queries.list_jobs(
        engine, lease_now_of(request), schedule=schedule_name(request), retired=True
    )
    listed_outboxes = await outboxes.list_outboxes(engine, lease_now_of(request), retired=True)
    context = await _common(request, csrf, flash, "/admin", failed=status_code >= 400) | {
        "leader": await queries.leader(
            engine, lease_now=lease_now_of(request), schedule=schedule_name(request)
        ),
        "jobs": [job for job in listed if job["retired_at"] is None],
        "retired_jobs": [job for job in listed if job["retired_at"] is not None],
        "outboxes": [outbox for outbox in listed_outboxes if not outbox["retired"]],
        "retired_outboxes": [outbox for outbox in listed_outboxes if outbox["retired"]],
        "pending": await queries.outbox_messages(
            engine, status="pending", limit=_PENDING_SHOWN, lease_now=lease_now_of(request)
        ),
        "scheduled": await queries.outbox_messages(
            engine, status="scheduled", limit=_PENDING_SHOWN, lease_now=lease_now_of(request)
        ),
        "pending_shown": _PENDING_SHOWN,
        "stuck": await queries.stuck_messages(engine),
    }
    return templates.TemplateResponse(request, "admin.html", context, status_code=status_code)


async def _job_page(
    request: Request,
    csrf: str,
    job_id: str,
    before: int | None,
    limit: int,
    flash: str | None,
    status: str | None = None,
) -> HTMLResponse:
    engine = _engine(request)
    filtered = f"&status={status}" if status is not None else ""
    query = f"?before={before}&limit={limit}" if before is not None else f"?limit={limit}"
    context = await _common(request, csrf, flash, f"/admin/jobs/{job_id}{query}{filtered}")
    context |= {"statuses": RUN_STATUSES, "status": status}
    try:
        runs = await queries.job_runs(
            engine,
            job_id,
            limit=limit,
            before=before,
            schedule=schedule_name(request),
            status=status,
        )
    except NotFound as exc:
        context |= {"job": None, "flash": str(exc), "failed": True, "runs": [], "older": None}
        return templates.TemplateResponse(request, "job.html", context, status_code=exc.status)
    jobs = await queries.list_jobs(
        engine, lease_now_of(request), schedule=schedule_name(request), retired=True
    )
    job = next((job for job in jobs if job["id"] == job_id), None)
    older = None
    if len(runs) == limit:
        older = f"/admin/jobs/{job_id}?before={runs[-1]['id']}&limit={limit}{filtered}"
    context |= {"job": job, "runs": runs, "older": older, "chart": chart.runs_chart(runs)}
    return templates.TemplateResponse(request, "job.html", context)


def _login_form(
    request: Request, key: bytes, error: str | None, status_code: int = 200
) -> Response:
    sent = request.cookies.get(session.LOGIN_COOKIE)
    nonce = session.login_nonce(sent)
    context = {"error": error, "csrf": session.login_csrf_for(key, nonce)}
    response = templates.TemplateResponse(request, "login.html", context, status_code=status_code)
    if nonce == sent:
        return response
    response.set_cookie(
        session.LOGIN_COOKIE,
        nonce,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/admin",
    )
    return response


_STYLESHEET = (Path(__file__).parent / "templates" / "admin.css").read_text()


@router.get("/admin.css")
async def stylesheet(request: Request) -> Response:
    """The page's style sheet (a file, not inline: the page's CSP allows no inline
    style, see headers.py)."""
    _key(request)
    return Response(_STYLESHEET, media_type="text/css")


@router.get("", response_class=HTMLResponse)
async def admin_page(request: Request, flash: str | None = None) -> Response:
    """The page when signed in; the sign-in form otherwise."""
    key = _key(request)
    cookie = await _session(request, key)
    if cookie is None:
        return _login_form(request, key, None)
    return await _page(request, session.csrf_for(key, cookie), _flash(flash))


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(
    request: Request,
    job_id: JobId,
    before: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    flash: str | None = None,
    status: RunStatus | None = None,
) -> Response:
    """A job's page: its state and its runs, newest first, ``limit`` per page, older
    ones from ``before`` (a run id) on, only those of ``status`` when it is given. The
    sign-in form when not signed in."""
    key = _key(request)
    cookie = await _session(request, key)
    if cookie is None:
        return _login_form(request, key, None)
    csrf = session.csrf_for(key, cookie)
    return await _job_page(request, csrf, job_id, before, limit, _flash(flash), status)


@router.post("/login")
async def login(
    request: Request, token: Annotated[str, Form()], csrf: Annotated[str, Form()] = ""
) -> Response:
    """Check the form's CSRF value (403 without it: a form posted from another site),
    then the token: set a new session cookie and go to the page, or say no (401; 429
    with Retry-After while this client must wait after repeated wrong tokens)."""
    key = _key(request)
    nonce = request.cookies.get(session.LOGIN_COOKIE)
    expected = session.login_csrf_for(key, nonce) if nonce else ""
    if not nonce or not hmac.compare_digest(csrf.encode("utf-8", "replace"), expected.encode()):
        return _login_form(
            request,
            key,
            "The form's CSRF value is missing or wrong; reload the page and sign in again.",
            status_code=403,
        )
    if not token_matches(key, token):
        wait = await refuse_wrong_token(request)
        if wait:
            response = _login_form(
                request,
                key,
                f"Too many wrong tokens from this address; wait {wait} s before the next try.",
                status_code=429,
            )
            response.headers["Retry-After"] = str(wait)
            return response
        return _login_form(request, key, "That is not the admin token.", status_code=401)
    engine = _engine(request)
    lease_now = lease_now_of(request)
    response = RedirectResponse("/admin", status_code=303)
    response.set_cookie(
        session.COOKIE,
        session.issue(key, await queries.lease_clock_now(engine, lease_now)),
        max_age=int(session.SESSION_MAX_AGE.total_seconds()),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/admin",
    )
    return response


@router.post("/logout")
async def logout(request: Request, csrf: Annotated[str, Form()]) -> Response:
    """Revoke every session issued until now (in every worker) and drop the cookie."""
    key = _key(request)
    cookie = await _session(request, key)
    if cookie is not None:
        _check_csrf(key, cookie, csrf)
        await session.revoke(_engine(request), lease_now_of(request))
    response = RedirectResponse("/admin", status_code=303)
    response.delete_cookie(session.COOKIE, path="/admin")
    return response


async def _act(
    request: Request,
    csrf: str,
    flash: str | Callable[[Any], str],
    action: Callable[[], Awaitable[Any]],
    back: str = "/admin",
) -> Response:
    key = _key(request)
    cookie = await _session(request, key)
    if cookie is None:
        raise HTTPException(401, "sign in first")
    _check_csrf(key, cookie, csrf)
    try:
        done = await action()
    except AdminError as exc:
        return await _page(request, csrf, str(exc), status_code=exc.status)
    code = flash if isinstance(flash, str) else flash(done)
    return RedirectResponse(f"{back}?flash={code}", status_code=303)


def _back(job_id: str, page: str | None) -> str:
    """Where a job action returns: the job's own page when it was posted from there."""
    return f"/admin/jobs/{job_id}" if page == "job" else "/admin"


@router.post("/outboxes/{name}/messages/{message_id}/reset")
async def reset(
    request: Request, name: OutboxName, message_id: MessageId, csrf: Annotated[str, Form()]
) -> Response:
    """Reset a stuck row, then back to the page."""
    return await _act(
        request,
        csrf,
        f"reset-{message_id}",
        lambda: queries.reset_outbox_message(
            _engine(request), name, message_id, lease_now_of(request)
        ),
    )


@router.post("/outboxes/{name}/reset-stuck")
async def reset_stuck(request: Request, name: OutboxName, csrf: Annotated[str, Form()]) -> Response:
    """Reset every stuck row of an outbox, then back to the page, saying how many."""
    return await _act(
        request,
        csrf,
        lambda done: f"resetstuck-{done['reset']}-{done['held']}-{name}",
        lambda: outboxes.reset_all_stuck(_engine(request), name, lease_now_of(request)),
    )


@router.post("/outboxes/{name}/forget")
async def forget_outbox(
    request: Request, name: OutboxName, csrf: Annotated[str, Form()]
) -> Response:
    """Forget a retired outbox (its messages deleted), then back to the page."""
    return await _act(
        request,
        csrf,
        f"forgetoutbox-{name}",
        lambda: outboxes.forget_outbox(_engine(request), name),
    )


Back = Annotated[str | None, Form(pattern="^job$")]


@router.post("/jobs/{job_id}/run")
async def run_now(
    request: Request, job_id: JobId, csrf: Annotated[str, Form()], back: Back = None
) -> Response:
    """Queue a job to run now, then back to the page it was asked from."""
    return await _act(
        request,
        csrf,
        f"run-{job_id}",
        lambda: queries.run_job_now(
            _engine(request),
            job_id,
            lease_now=lease_now_of(request),
            schedule=schedule_name(request),
        ),
        _back(job_id, back),
    )


@router.post("/jobs/{job_id}/forget")
async def forget(request: Request, job_id: JobId, csrf: Annotated[str, Form()]) -> Response:
    """Forget a retired job (its row and history deleted), then back to the main page."""
    return await _act(
        request,
        csrf,
        f"forget-{job_id}",
        lambda: queries.forget_job(_engine(request), job_id, schedule=schedule_name(request)),
    )


@router.post("/jobs/{job_id}/pause")
async def pause(
    request: Request, job_id: JobId, csrf: Annotated[str, Form()], back: Back = None
) -> Response:
    """Pause a job (no slot is claimed until it is resumed), then back."""
    return await _act(
        request,
        csrf,
        f"pause-{job_id}",
        lambda: queries.set_paused(_engine(request), job_id, True, schedule=schedule_name(request)),
        _back(job_id, back),
    )


@router.post("/jobs/{job_id}/resume")
async def resume(
    request: Request, job_id: JobId, csrf: Annotated[str, Form()], back: Back = None
) -> Response:
    """Resume a paused job, then back."""
    return await _act(
        request,
        csrf,
        f"resume-{job_id}",
        lambda: queries.set_paused(
            _engine(request), job_id, False, schedule=schedule_name(request)
        ),
        _back(job_id, back),
    )
