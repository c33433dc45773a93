"""The admin page: server-rendered HTML, no JavaScript build.

Sign-in posts the token once; the page then keeps an HttpOnly, SameSite=Strict session
cookie that carries its issue time and is signed with the token (never the token
itself); sign-out revokes it everywhere (see session.py). Every POST carries a CSRF
field derived from the session. Repeated wrong tokens from one client are slowed (see
throttle.py). Without ADMIN_TOKEN every route here answers 404.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from app.db import Database
from app.scheduler import Clock

from . import queries, session, throttle
from .auth import admin_key, token_matches
from .errors import AdminError
from .params import JobId, MessageId, OutboxName

__all__ = ["router"]

router = APIRouter(prefix="/admin", include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")

_FLASH = re.compile(r"^(reset|run)-([A-Za-z0-9_.:-]{1,200})$")


def _key(request: Request) -> bytes:
    key = admin_key(request.app.state.settings)
    if key is None:
        raise HTTPException(404, "Not Found")
    return key


def _engine(request: Request) -> Any:
    database: Database = request.app.state.database
    return database.engine


def _now(request: Request) -> datetime:
    clock: Clock = request.app.state.clock
    return clock.now()


async def _session(request: Request, key: bytes) -> str | None:
    """The request's session cookie when it is signed, unexpired and not revoked."""
    cookie = request.cookies.get(session.COOKIE)
    issued = session.issued_at(key, cookie)
    if cookie is None or issued is None:
        return None
    if not await session.is_current(_engine(request), issued, _now(request)):
        return None
    return cookie


def _check_csrf(key: bytes, cookie: str, offered: str) -> None:
    expected = session.csrf_for(key, cookie)
    if not hmac.compare_digest(offered.encode("utf-8", "replace"), expected.encode()):
        raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page")


def _flash(code: str | None) -> str | None:
    match = _FLASH.match(code or "")
    if match is None:
        return None
    action, subject = match.groups()
    if action == "reset":
        return f"Message {subject} is pending again and due now."
    return f"Job {subject} is queued to run now."


async def _page(
    request: Request, csrf: str, flash: str | None, status_code: int = 200
) -> HTMLResponse:
    engine = _engine(request)
    context = {
        "csrf": csrf,
        "flash": flash,
        "leader": await queries.leader(engine),
        "jobs": await queries.list_jobs(engine, _now(request)),
        "outboxes": await queries.outbox_summary(engine, _now(request)),
        "stuck": await queries.stuck_messages(engine),
    }
    return templates.TemplateResponse(request, "admin.html", context, status_code=status_code)


def _login_form(request: Request, error: str | None, status_code: int = 200) -> Response:
    return templates.TemplateResponse(
        request, "login.html", {"error": error}, status_code=status_code
    )


@router.get("", response_class=HTMLResponse)
async def admin_page(request: Request, flash: str | None = None) -> Response:
    """The page when signed in; the sign-in form otherwise."""
    key = _key(request)
    cookie = await _session(request, key)
    if cookie is None:
        return _login_form(request, None)
    return await _page(request, session.csrf_for(key, cookie), _flash(flash))


@router.post("/login")
async def login(request: Request, token: Annotated[str, Form()]) -> Response:
    """Check the token; set a new session cookie and go to the page, or say no (401);
    429 with Retry-After while this client must wait after repeated failures."""
    key = _key(request)
    engine = _engine(request)
    now = _now(request)
    client = request.client.host if request.client else "unknown"
    wait = await throttle.wait_before_attempt(engine, client, now)
    if wait:
        response = _login_form(
            request, f"Too many wrong tokens; try again in {wait} s.", status_code=429
        )
        response.headers["Retry-After"] = str(wait)
        return response
    if not token_matches(key, token):
        await throttle.record_failure(engine, client, now)
        return _login_form(request, "That is not the admin token.", status_code=401)
    await throttle.clear_failures(engine, client)
    response = RedirectResponse("/admin", status_code=303)
    response.set_cookie(
        session.COOKIE,
        session.issue(key, now),
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
        await session.revoke(_engine(request), _now(request))
    response = RedirectResponse("/admin", status_code=303)
    response.delete_cookie(session.COOKIE, path="/admin")
    return response


async def _act(
    request: Request, csrf: str, flash: str, action: Callable[[], Awaitable[None]]
) -> Response:
    key = _key(request)
    cookie = await _session(request, key)
    if cookie is None:
        raise HTTPException(401, "sign in first")
    _check_csrf(key, cookie, csrf)
    try:
        await action()
    except AdminError as exc:
        return await _page(request, csrf, str(exc), status_code=exc.status)
    return RedirectResponse(f"/admin?flash={flash}", status_code=303)


@router.post("/outboxes/{name}/messages/{message_id}/reset")
async def reset(
    request: Request, name: OutboxName, message_id: MessageId, csrf: Annotated[str, Form()]
) -> Response:
    """Reset a stuck row, then back to the page."""
    return await _act(
        request,
        csrf,
        f"reset-{message_id}",
        lambda: queries.reset_outbox_message(_engine(request), name, message_id, _now(request)),
    )


@router.post("/jobs/{job_id}/run")
async def run_now(request: Request, job_id: JobId, csrf: Annotated[str, Form()]) -> Response:
    """Queue a job to run now, then back to the page."""
    return await _act(
        request,
        csrf,
        f"run-{job_id}",
        lambda: queries.run_job_now(_engine(request), job_id, _now(request)),
    )
