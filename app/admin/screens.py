"""What the admin page shows: the main screen, a job's screen, the sign-in form and the
line that tells how an action went, rendered from templates/.

The main screen shows the leader, the jobs, the outboxes and their pending, scheduled
and stuck rows; a job's screen its state and its history, paged by ``before=<run id>``.
Both refresh themselves (a meta refresh to the same view without its flash) and read
values the way the CLI prints them (see display.py), "in 14 min" told on the lease
clock, which the times shown are on. The routes that serve them are page.py's.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from ..operations import display
from ..operations.errors import NotFound
from ..operations.jobs import list_jobs
from ..operations.leadership import leader
from ..operations.messages import outbox_messages, stuck_messages
from ..operations.outboxes import list_outboxes
from ..operations.reading import lease_clock_now
from ..operations.run_status import RUN_STATUSES
from ..operations.runs import job_runs
from ..printable import printable, printable_name, printable_text
from . import chart, session
from .api import engine_of, lease_now_of, schedule_name
from .params import path_segment

__all__ = [
    "REFRESH_SECONDS",
    "STYLESHEET",
    "flash_line",
    "job_screen",
    "login_form",
    "main_screen",
]

_TEMPLATES = Path(__file__).parent / "templates"
_templates = Jinja2Templates(directory=_TEMPLATES)
_templates.env.globals["display"] = display


def _shown(value: object) -> object:
    # Every {{ value }} of a template: a control or invisible character from data
    # (U+202E above all, which reverses what follows it on screen; LF, CR and TAB, which
    # HTML lays out as a space) shown as an escape, on one line.
    # Markup (the chart's SVG, an error's lines) is the page's own, built escaped.
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


def _identifier(value: object) -> str:
    # A key, an id, a name, a host: who something is, so two that differ look different.
    return printable_name(str(value))


def _lines(value: object) -> Markup:
    # An error's text (a traceback) shown as its lines, each escaped.
    return escape(printable_text(str(value)))


_templates.env.finalize = _shown
_templates.env.filters["identifier"] = _identifier
_templates.env.filters["lines"] = _lines
# A value from data as one segment of a link's or a form's URL.
_templates.env.filters["segment"] = path_segment

# The page's style sheet (a file, not inline: the page's CSP allows no inline style,
# see headers.py).
STYLESHEET = (_TEMPLATES / "admin.css").read_text()

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


def flash_line(code: str | None) -> str | None:
    """The line an action's ``flash`` code (what the action redirected with) shows; None
    for no code or one no action makes."""
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
    request: Request,
    base: str,
    csrf: str,
    flash: str | None,
    refresh_url: str,
    failed: bool = False,
) -> dict[str, Any]:
    return {
        # Every link and form of a signed-in screen is below its session's path.
        "base": base,
        "admin": session.admin_path(request),
        "csrf": csrf,
        "flash": flash,
        "failed": failed,
        # "in 14 min" is told on the clock the times shown are on, not this host's.
        "now": await lease_clock_now(engine_of(request), lease_now_of(request)),
        "zone": request.app.state.settings.TIMEZONE,
        "refresh_url": refresh_url,
        "refresh_seconds": REFRESH_SECONDS,
    }


async def main_screen(
    request: Request, base: str, csrf: str, flash: str | None, status_code: int = 200
) -> HTMLResponse:
    """The main screen of the session whose page is under ``base``, ``flash`` told at
    its top (as a failure for a 4xx ``status_code``, which it answers with)."""
    engine = engine_of(request)
    listed = await list_jobs(
        engine, lease_now_of(request), schedule=schedule_name(request), retired=True
    )
    listed_outboxes = await list_outboxes(engine, lease_now_of(request), retired=True)
    failed = status_code >= 400
    context = await _common(request, base, csrf, flash, f"{base}/", failed=failed) | {
        "leader": await leader(
            engine, lease_now=lease_now_of(request), schedule=schedule_name(request)
        ),
        "jobs": [job for job in listed if job["retired_at"] is None],
        "retired_jobs": [job for job in listed if job["retired_at"] is not None],
        "outboxes": [outbox for outbox in listed_outboxes if not outbox["retired"]],
        "retired_outboxes": [outbox for outbox in listed_outboxes if outbox["retired"]],
        "pending": await outbox_messages(
            engine, status="pending", limit=_PENDING_SHOWN, lease_now=lease_now_of(request)
        ),
        "scheduled": await outbox_messages(
            engine, status="scheduled", limit=_PENDING_SHOWN, lease_now=lease_now_of(request)
        ),
        "pending_shown": _PENDING_SHOWN,
        "stuck": await stuck_messages(engine),
    }
    return _templates.TemplateResponse(request, "admin.html", context, status_code=status_code)


async def job_screen(
    request: Request,
    base: str,
    csrf: str,
    job_id: str,
    before: int | None,
    limit: int,
    flash: str | None,
    status: str | None = None,
) -> HTMLResponse:
    """A job's screen (of the session whose page is under ``base``): its state and
    ``limit`` of its runs older than run ``before`` (only those of ``status`` when it is
    given), with a link to the older ones and a chart; the refusal, answered with its
    status, for an unknown job."""
    engine = engine_of(request)
    filtered = f"&status={status}" if status is not None else ""
    query = f"?before={before}&limit={limit}" if before is not None else f"?limit={limit}"
    page = f"{base}/jobs/{path_segment(job_id)}"
    context = await _common(request, base, csrf, flash, f"{page}{query}{filtered}")
    context |= {"statuses": RUN_STATUSES, "status": status}
    try:
        runs = await job_runs(
            engine,
            job_id,
            limit=limit,
            before=before,
            schedule=schedule_name(request),
            status=status,
        )
    except NotFound as exc:
        context |= {"job": None, "flash": str(exc), "failed": True, "runs": [], "older": None}
        return _templates.TemplateResponse(request, "job.html", context, status_code=exc.status)
    jobs = await list_jobs(
        engine, lease_now_of(request), schedule=schedule_name(request), retired=True
    )
    job = next((job for job in jobs if job["id"] == job_id), None)
    older = None
    if len(runs) == limit:
        older = f"{page}?before={runs[-1]['id']}&limit={limit}{filtered}"
    context |= {"job": job, "runs": runs, "older": older, "chart": chart.runs_chart(runs)}
    return _templates.TemplateResponse(request, "job.html", context)


def login_form(
    request: Request, key: bytes, now: datetime, error: str | None, status_code: int = 200
) -> Response:
    """The sign-in form served at ``now`` (on the lease clock), ``error`` told above it,
    with its CSRF value (session.sign_in_form_value)."""
    context = {
        "error": error,
        "admin": session.admin_path(request),
        "csrf": session.sign_in_form_value(key, now),
    }
    return _templates.TemplateResponse(request, "login.html", context, status_code=status_code)
