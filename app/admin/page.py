"""The admin page: server-rendered HTML, no JavaScript build.

Sign-in posts the token once; the page then keeps an HttpOnly, SameSite=Strict cookie
derived from the token (never the token itself). Every POST carries a CSRF field
derived from the token as well. Without ADMIN_TOKEN every route here answers 404.
"""

from __future__ import annotations

import hmac
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from app.db import Database
from app.scheduler import Clock
from app.settings import Settings

from . import queries
from .auth import COOKIE, csrf_token, session_valid, session_value, token_matches
from .errors import AdminError
from .params import JobId, MessageId, OutboxName

__all__ = ["router"]

router = APIRouter(prefix="/admin", include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")

_FLASH = re.compile(r"^(reset|run)-([A-Za-z0-9_.:-]{1,200})$")


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    if settings.ADMIN_TOKEN is None:
        raise HTTPException(404, "Not Found")
    return settings


def _check_csrf(settings: Settings, offered: str) -> None:
    if not hmac.compare_digest(offered.encode(), csrf_token(settings).encode()):
        raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page")


def _signed_in(request: Request, settings: Settings) -> bool:
    return session_valid(settings, request.cookies.get(COOKIE))


def _flash(code: str | None) -> str | None:
    match = _FLASH.match(code or "")
    if match is None:
        return None
    action, subject = match.groups()
    if action == "reset":
        return f"Message {subject} is pending again and due now."
    return f"Job {subject} is queued to run now."


async def _page(
    request: Request, settings: Settings, flash: str | None, status_code: int = 200
) -> HTMLResponse:
    engine = request.app.state.database.engine
    clock: Clock = request.app.state.clock
    context = {
        "csrf": csrf_token(settings),
        "flash": flash,
        "leader": await queries.leader(engine),
        "jobs": await queries.list_jobs(engine),
        "outboxes": await queries.outbox_summary(engine, clock.now()),
        "stuck": await queries.stuck_messages(engine),
    }
    return templates.TemplateResponse(request, "admin.html", context, status_code=status_code)


@router.get("", response_class=HTMLResponse)
async def admin_page(request: Request, flash: str | None = None) -> Response:
    """The page when signed in; the sign-in form otherwise."""
    settings = _settings(request)
    if not _signed_in(request, settings):
        return templates.TemplateResponse(request, "login.html", {"error": None})
    return await _page(request, settings, _flash(flash))


@router.post("/login")
async def login(request: Request, token: Annotated[str, Form()]) -> Response:
    """Check the token; set the session cookie and go to the page, or say no (401)."""
    settings = _settings(request)
    if not token_matches(settings, token):
        return templates.TemplateResponse(
            request, "login.html", {"error": "That is not the admin token."}, status_code=401
        )
    response = RedirectResponse("/admin", status_code=303)
    response.set_cookie(
        COOKIE,
        session_value(settings),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/admin",
    )
    return response


@router.post("/logout")
async def logout(request: Request, csrf: Annotated[str, Form()]) -> Response:
    """Drop the session cookie."""
    _check_csrf(_settings(request), csrf)
    response = RedirectResponse("/admin", status_code=303)
    response.delete_cookie(COOKIE, path="/admin")
    return response


async def _act(
    request: Request, csrf: str, flash: str, action: Callable[[], Awaitable[None]]
) -> Response:
    settings = _settings(request)
    if not _signed_in(request, settings):
        raise HTTPException(401, "sign in first")
    _check_csrf(settings, csrf)
    try:
        await action()
    except AdminError as exc:
        return await _page(request, settings, str(exc), status_code=exc.status)
    return RedirectResponse(f"/admin?flash={flash}", status_code=303)


@router.post("/outboxes/{name}/messages/{message_id}/reset")
async def reset(
    request: Request, name: OutboxName, message_id: MessageId, csrf: Annotated[str, Form()]
) -> Response:
    """Reset a stuck row, then back to the page."""
    database: Database = request.app.state.database
    clock: Clock = request.app.state.clock
    return await _act(
        request,
        csrf,
        f"reset-{message_id}",
        lambda: queries.reset_outbox_message(database.engine, name, message_id, clock.now()),
    )


@router.post("/jobs/{job_id}/run")
async def run_now(request: Request, job_id: JobId, csrf: Annotated[str, Form()]) -> Response:
    """Queue a job to run now, then back to the page."""
    database: Database = request.app.state.database
    clock: Clock = request.app.state.clock
    return await _act(
        request,
        csrf,
        f"run-{job_id}",
        lambda: queries.run_job_now(database.engine, job_id, clock.now()),
    )
