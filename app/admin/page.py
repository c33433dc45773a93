"""The admin page's routes: server-rendered HTML, no JavaScript build.

``/admin`` is the sign-in form. Signed in, the page lives under its session's secret
path ``/admin/s/<sid>/`` (session.py): that is the main screen, ``<base>/jobs/<id>`` a
job's; each action posts a form and goes back to the screen it came from with a flash
saying how it went. What the screens show is screens.py's.

Sign-in posts the token once; the page then keeps an HttpOnly, SameSite=Strict session
cookie that carries its issue time and is signed with the token (never the token
itself), sent and honoured under its session's path only; sign-out revokes it
everywhere (see session.py). A request under a session path without the cookie made
for it is signed out (a page goes to the sign-in form, an action answers 401), whatever
was missing or wrong. Every POST carries a CSRF field derived from the session, and the
sign-in one derived from the form's own cookie.
Repeated wrong tokens from one client are slowed, the right one never (see
throttle.py). Without ADMIN_TOKEN every route here answers 404.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.storable import INT64_MAX

from ..operations.errors import AdminError
from ..operations.jobs import forget_job, run_job_now, set_paused
from ..operations.messages import reset_outbox_message
from ..operations.outboxes import forget_outbox as forget_outbox_rows
from ..operations.outboxes import reset_all_stuck
from ..operations.reading import lease_clock_now
from ..operations.run_status import RunStatus
from . import session
from .api import engine_of, lease_now_of, schedule_name
from .auth import admin_key, refuse_wrong_token, token_matches
from .params import JobId, MessageId, OutboxName, path_segment
from .screens import STYLESHEET, flash_line, job_screen, login_form, main_screen

__all__ = ["router"]

router = APIRouter(prefix="/admin", include_in_schema=False)


def _key(request: Request) -> bytes:
    key = admin_key(request.app.state.settings)
    if key is None:
        raise HTTPException(404, "Not Found")
    return key


async def _session(request: Request, key: bytes, sid: str) -> str | None:
    """The request's session cookie when it is the one of the path's ``sid``, signed,
    unexpired and not revoked."""
    cookie = session.session_cookie(request, key, sid)
    issued = session.issued_at(key, cookie)
    if cookie is None or issued is None:
        return None
    if not await session.is_current(engine_of(request), issued, lease_now_of(request)):
        return None
    return cookie


def _check_csrf(key: bytes, cookie: str, offered: str) -> None:
    expected = session.csrf_for(key, cookie)
    if not hmac.compare_digest(offered.encode("utf-8", "replace"), expected.encode()):
        raise HTTPException(403, "the form's CSRF token is missing or wrong; reload the page")


@router.get("/admin.css")
async def stylesheet(request: Request) -> Response:
    """The page's style sheet (a file, not inline: the page's CSP allows no inline
    style, see headers.py)."""
    _key(request)
    return Response(STYLESHEET, media_type="text/css")


def _to_sign_in(request: Request) -> Response:
    """Where a signed-out request for a page of a session goes: the sign-in form."""
    return RedirectResponse(session.admin_path(request), status_code=303)


@router.get("", response_class=HTMLResponse)
async def sign_in_page(request: Request) -> Response:
    """The sign-in form (a session's page is under its own path, and its cookie is
    never sent here)."""
    now = await lease_clock_now(engine_of(request), lease_now_of(request))
    return login_form(request, _key(request), now, None)


@router.get("/s/{sid}/", response_class=HTMLResponse)
async def admin_page(request: Request, sid: str, flash: str | None = None) -> Response:
    """The main screen of the session ``sid``; to the sign-in form without it."""
    key = _key(request)
    cookie = await _session(request, key, sid)
    if cookie is None:
        return _to_sign_in(request)
    base = session.session_path(request, sid)
    return await main_screen(request, base, session.csrf_for(key, cookie), flash_line(flash))


@router.get("/s/{sid}/jobs/{job_id}", response_class=HTMLResponse)
async def job_page(
    request: Request,
    sid: str,
    job_id: JobId,
    before: Annotated[int | None, Query(ge=1, le=INT64_MAX)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    flash: str | None = None,
    status: RunStatus | None = None,
) -> Response:
    """A job's page: its state and its runs, newest first, ``limit`` per page, older
    ones from ``before`` (a run id) on, only those of ``status`` when it is given. To
    the sign-in form when the session ``sid`` is not the request's."""
    key = _key(request)
    cookie = await _session(request, key, sid)
    if cookie is None:
        return _to_sign_in(request)
    csrf = session.csrf_for(key, cookie)
    base = session.session_path(request, sid)
    return await job_screen(request, base, csrf, job_id, before, limit, flash_line(flash), status)


@router.post("/login")
async def login(
    request: Request, token: Annotated[str, Form()], csrf: Annotated[str, Form()] = ""
) -> Response:
    """Check where the post came from (403 from another site's page, as the browser
    tells it) and the form's CSRF value (403 without a current one), then the token:
    set a new session cookie and go to the page under its session's path, or say no
    (401; 429 with Retry-After while this client must wait after repeated wrong
    tokens)."""
    key = _key(request)
    engine = engine_of(request)
    now = await lease_clock_now(engine, lease_now_of(request))
    # A browser says where a post comes from (Fetch Metadata): another site's page, or
    # another port of this host ("same-site"), may hold a form value it read here.
    fetched_from = request.headers.get("sec-fetch-site", "same-origin")
    if fetched_from not in ("same-origin", "none"):
        return login_form(
            request,
            key,
            now,
            "This sign-in was posted from another site's page; sign in on this form.",
            status_code=403,
        )
    if not session.sign_in_form_value_is_current(key, csrf, now):
        return login_form(
            request,
            key,
            now,
            "The form's CSRF value is missing, wrong or too old; sign in again on this form.",
            status_code=403,
        )
    if not token_matches(key, token):
        wait = await refuse_wrong_token(request)
        if wait:
            response = login_form(
                request,
                key,
                now,
                f"Too many wrong tokens from this address; wait {wait} s before the next try.",
                status_code=429,
            )
            response.headers["Retry-After"] = str(wait)
            return response
        return login_form(request, key, now, "That is not the admin token.", status_code=401)
    cookie = session.issue(key, now)
    base = session.session_path(request, session.sid_for(key, cookie))
    response = RedirectResponse(f"{base}/", status_code=303)
    session.set_cookie(
        response,
        request,
        session.COOKIE,
        cookie,
        path=f"{base}/",
        max_age=int(session.SESSION_MAX_AGE.total_seconds()),
    )
    return response


@router.post("/s/{sid}/logout")
async def logout(request: Request, sid: str, csrf: Annotated[str, Form()]) -> Response:
    """Revoke every session issued until now (in every worker), drop the cookie of this
    path and go to the sign-in form."""
    key = _key(request)
    cookie = await _session(request, key, sid)
    if cookie is not None:
        _check_csrf(key, cookie, csrf)
        await session.revoke(engine_of(request), lease_now_of(request))
    response = _to_sign_in(request)
    # Cleared where the browser holds a cookie made for this path, current or not (a sid
    # that matches one is URL-safe, as a cookie's Path must be).
    if session.session_cookie(request, key, sid) is not None:
        response.delete_cookie(session.COOKIE, path=f"{session.session_path(request, sid)}/")
    return response


async def _act(
    request: Request,
    sid: str,
    csrf: str,
    flash: str | Callable[[Any], str],
    action: Callable[[], Awaitable[Any]],
    back: str = "",
) -> Response:
    """Run ``action`` for the session ``sid`` (401 without it, 403 for a wrong CSRF
    value), then back to ``back`` below the session's path with ``flash``."""
    key = _key(request)
    cookie = await _session(request, key, sid)
    if cookie is None:
        raise HTTPException(401, "sign in first")
    _check_csrf(key, cookie, csrf)
    base = session.session_path(request, sid)
    try:
        done = await action()
    except AdminError as exc:
        return await main_screen(request, base, csrf, str(exc), status_code=exc.status)
    code = flash if isinstance(flash, str) else flash(done)
    return RedirectResponse(f"{base}/{back}?flash={code}", status_code=303)


def _back(job_id: str, page: str | None) -> str:
    """Where a job action returns, below the session's path: the job's own page when it
    was posted from there, else the main screen."""
    return f"jobs/{path_segment(job_id)}" if page == "job" else ""


@router.post("/s/{sid}/outboxes/{name}/messages/{message_id}/reset")
async def reset(
    request: Request,
    sid: str,
    name: OutboxName,
    message_id: MessageId,
    csrf: Annotated[str, Form()],
) -> Response:
    """Reset a stuck row, then back to the page."""
    return await _act(
        request,
        sid,
        csrf,
        f"reset-{message_id}",
        lambda: reset_outbox_message(engine_of(request), name, message_id, lease_now_of(request)),
    )


@router.post("/s/{sid}/outboxes/{name}/reset-stuck")
async def reset_stuck(
    request: Request, sid: str, name: OutboxName, csrf: Annotated[str, Form()]
) -> Response:
    """Reset every stuck row of an outbox, then back to the page, saying how many."""
    return await _act(
        request,
        sid,
        csrf,
        lambda done: f"resetstuck-{done['reset']}-{done['held']}-{name}",
        lambda: reset_all_stuck(engine_of(request), name, lease_now_of(request)),
    )


@router.post("/s/{sid}/outboxes/{name}/forget")
async def forget_outbox(
    request: Request, sid: str, name: OutboxName, csrf: Annotated[str, Form()]
) -> Response:
    """Forget a retired outbox (its messages deleted), then back to the page."""
    return await _act(
        request,
        sid,
        csrf,
        f"forgetoutbox-{name}",
        lambda: forget_outbox_rows(engine_of(request), name),
    )


Back = Annotated[str | None, Form(pattern="^job$")]


@router.post("/s/{sid}/jobs/{job_id}/run")
async def run_now(
    request: Request, sid: str, job_id: JobId, csrf: Annotated[str, Form()], back: Back = None
) -> Response:
    """Queue a job to run now, then back to the page it was asked from."""
    return await _act(
        request,
        sid,
        csrf,
        f"run-{job_id}",
        lambda: run_job_now(
            engine_of(request),
            job_id,
            lease_now=lease_now_of(request),
            schedule=schedule_name(request),
        ),
        _back(job_id, back),
    )


@router.post("/s/{sid}/jobs/{job_id}/forget")
async def forget(
    request: Request, sid: str, job_id: JobId, csrf: Annotated[str, Form()]
) -> Response:
    """Forget a retired job (its row and history deleted), then back to the main page."""
    return await _act(
        request,
        sid,
        csrf,
        f"forget-{job_id}",
        lambda: forget_job(engine_of(request), job_id, schedule=schedule_name(request)),
    )


@router.post("/s/{sid}/jobs/{job_id}/pause")
async def pause(
    request: Request, sid: str, job_id: JobId, csrf: Annotated[str, Form()], back: Back = None
) -> Response:
    """Pause a job (no slot is claimed until it is resumed), then back."""
    return await _act(
        request,
        sid,
        csrf,
        f"pause-{job_id}",
        lambda: set_paused(engine_of(request), job_id, True, schedule=schedule_name(request)),
        _back(job_id, back),
    )


@router.post("/s/{sid}/jobs/{job_id}/resume")
async def resume(
    request: Request, sid: str, job_id: JobId, csrf: Annotated[str, Form()], back: Back = None
) -> Response:
    """Resume a paused job, then back."""
    return await _act(
        request,
        sid,
        csrf,
        f"resume-{job_id}",
        lambda: set_paused(engine_of(request), job_id, False, schedule=schedule_name(request)),
        _back(job_id, back),
    )
