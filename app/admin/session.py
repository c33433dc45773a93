"""Admin page sessions: a signed cookie carrying its issue time, revoked by a "not
before" kept in the database.

The sign-in form carries a CSRF value of its own, ``<issued>.<HMAC of that>`` (as the
cookie below, for another purpose), current for SIGN_IN_FORM_MAX_AGE; a sign-in without
a current one is refused before its token is read. Another site cannot read the form,
so a form it posts from the admin's browser has none: it can neither sign the admin in
nor spend the admin's address's wrong tokens (throttle.py). The value rides in the
form alone, tied to no cookie: a cookie can be set over by any server of the host (a
browser scopes cookies by host, not port), and one tossed in would refuse the admin's
right token; nothing the form needs can be changed from outside the page.

The cookie is ``<issued, microseconds since the epoch>.<HMAC of that, keyed by the
admin token>``; it never contains the token. It is current while it is younger than
SESSION_MAX_AGE and issued after ``admin_sessions.not_before``. Sign-out moves
``not_before`` to now, so every cookie issued until then stops working in every worker
at once (they all read the same row). The CSRF value of a page is derived from its
session cookie, so it dies with the session.

Issue times, ages and ``not_before`` are read on the lease clock (the database
server's, see app/scheduler/clock.py): a cookie issued by a worker whose clock runs
ahead is no cookie "from the future" to another, and a sign-out on a worker whose clock
runs behind still ends the sessions issued before it elsewhere.

A browser sends a host's cookies to every port of that host, so a cookie sent to all of
/admin would reach another local user's server on another port of 127.0.0.1 too. The
signed-in page therefore lives under a path of its session's own, ``/admin/s/<sid>/``
(``session_path``), where the sid is an HMAC of the cookie keyed by the admin token
(``sid_for``): the cookie is set with that Path, so the browser sends it there only, on
any port, and it is honoured there only (``session_cookie``). Another server is sent it
only at a path it cannot compute without the token, and a cookie it got some other way
opens nothing elsewhere. The sign-in form stays at ``/admin``. Such a server can also
set a cookie of this name for the whole host, which the browser then sends beside ours:
every value sent is looked at (``_cookie_values``), so one tossed in neither opens a
session nor hides the right one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from app.scheduler.clock import LEASE_NOW_SQL

__all__ = [
    "COOKIE",
    "SESSION_MAX_AGE",
    "SIGN_IN_FORM_MAX_AGE",
    "admin_path",
    "csrf_for",
    "is_current",
    "issue",
    "issued_at",
    "revoke",
    "session_cookie",
    "session_path",
    "set_cookie",
    "sid_for",
    "sign_in_form_value",
    "sign_in_form_value_is_current",
]

COOKIE = "regent_admin"
SESSION_MAX_AGE = timedelta(hours=12)
# As long as a session: a form left open as long can still sign in.
SIGN_IN_FORM_MAX_AGE = SESSION_MAX_AGE
# Bytes of the HMAC a sid keeps: 128 bits, 22 URL-safe characters.
_SID_BYTES = 16

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LONGEST_COOKIE = 100
# Microseconds since the epoch to 9999-12-31 have 18 digits.
_LONGEST_MICROS = 18

_NOW_AND_NOT_BEFORE = text(
    f"SELECT {LEASE_NOW_SQL} AS now,"
    " (SELECT not_before FROM admin_sessions WHERE id = 1) AS not_before"
)
_REVOKE = text(
    f"""
    INSERT INTO admin_sessions (id, not_before) VALUES (1, {LEASE_NOW_SQL})
    ON CONFLICT (id) DO UPDATE
    SET not_before = greatest(admin_sessions.not_before, excluded.not_before)
    """
)


def _sign(key: bytes, purpose: str, value: str) -> str:
    return hmac.new(key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()


def _signed_time(key: bytes, purpose: str, now: datetime) -> str:
    micros = str((now - _EPOCH) // timedelta(microseconds=1))
    return f"{micros}.{_sign(key, purpose, micros)}"


def _time_signed(key: bytes, purpose: str, value: str | None) -> datetime | None:
    """The time in ``value`` when _signed_time made it for ``purpose``; else None."""
    if not value or len(value) > _LONGEST_COOKIE:
        return None
    micros, _, signature = value.partition(".")
    # Digits of a time datetime can hold, checked before anything is signed or encoded
    # (a form field can hold a lone surrogate).
    if not micros.isascii() or not micros.isdigit() or len(micros) > _LONGEST_MICROS:
        return None
    expected = _sign(key, purpose, micros)
    if not hmac.compare_digest(signature.encode("utf-8", "replace"), expected.encode()):
        return None
    return _EPOCH + timedelta(microseconds=int(micros))


def issue(key: bytes, now: datetime) -> str:
    """A new session cookie value, issued at ``now`` (on the lease clock:
    reading.lease_clock_now)."""
    return _signed_time(key, "session", now)


def issued_at(key: bytes, cookie: str | None) -> datetime | None:
    """When a correctly signed cookie was issued; None for anything else."""
    return _time_signed(key, "session", cookie)


def sign_in_form_value(key: bytes, now: datetime) -> str:
    """The CSRF value of a sign-in form served at ``now`` (on the lease clock)."""
    return _signed_time(key, "login", now)


def sign_in_form_value_is_current(key: bytes, value: str, now: datetime) -> bool:
    """Whether ``value`` is a sign-in form's CSRF value (sign_in_form_value) served
    less than SIGN_IN_FORM_MAX_AGE before ``now``, on the lease clock."""
    served = _time_signed(key, "login", value)
    return served is not None and timedelta(0) <= now - served < SIGN_IN_FORM_MAX_AGE


async def is_current(
    engine: AsyncEngine, issued: datetime, lease_now: datetime | None = None
) -> bool:
    """True when a session issued at ``issued`` has neither expired nor been revoked,
    read on the lease clock (``lease_now`` as clock.lease_now gives it, None for the
    database server's)."""
    async with engine.connect() as conn:
        read = (await conn.execute(_NOW_AND_NOT_BEFORE, {"lease_now": lease_now})).one()
    if not timedelta(0) <= read.now - issued < SESSION_MAX_AGE:
        return False
    return read.not_before is None or issued > read.not_before


async def revoke(engine: AsyncEngine, lease_now: datetime | None = None) -> None:
    """End every session issued up to now on the lease clock (``lease_now`` as
    clock.lease_now gives it, None for the database server's), in every worker."""
    async with engine.begin() as conn:
        await conn.execute(_REVOKE, {"lease_now": lease_now})


def csrf_for(key: bytes, cookie: str) -> str:
    """The CSRF value of the page served to the session ``cookie``."""
    return _sign(key, "csrf", cookie)


def sid_for(key: bytes, cookie: str) -> str:
    """The secret path segment of the session ``cookie``: a URL-safe HMAC of it, keyed
    by the admin token (22 characters)."""
    digest = hmac.new(key, f"path:{cookie}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest[:_SID_BYTES]).rstrip(b"=").decode()


def admin_path(request: Request) -> str:
    """Where the sign-in form is, as the browser sees it: /admin after the root path a
    proxy set-up serves the app under (``--root-path``)."""
    root_path: str = request.scope.get("root_path", "")
    return f"{root_path.rstrip('/')}/admin"


def session_path(request: Request, sid: str) -> str:
    """The base of the page of the session ``sid`` as the browser sees it (no trailing
    slash): its main screen is this plus "/", every other route below it; the session
    cookie's Path is this plus "/"."""
    return f"{admin_path(request)}/s/{sid}"


def session_cookie(request: Request, key: bytes, sid: str) -> str | None:
    """The session cookie the request carries whose sid is ``sid``; None when it
    carries none. Every ``COOKIE`` value in the Cookie header is looked at (a browser
    also sends one set for a wider path, /admin by an older release or by another
    server of the host), and only one made for this path counts."""
    wanted = sid.encode("utf-8", "replace")
    for value in _cookie_values(request, COOKIE):
        if hmac.compare_digest(sid_for(key, value).encode(), wanted):
            return value
    return None


def _cookie_values(request: Request, name: str) -> list[str]:
    """Every non-empty value of the cookie ``name`` in the request's Cookie headers, in
    the order sent (a browser sends the one set for the longest path first). A browser
    keeps one cookie jar per host, not per port: a server on another port of the host
    can set a cookie of the same name for a wider path, and request.cookies would keep
    only the last one sent, which is then that server's."""
    values = []
    for header in request.headers.getlist("cookie"):
        for pair in header.split(";"):
            cookie, _, value = pair.partition("=")
            value = value.strip()
            if cookie.strip() == name and value and len(value) <= _LONGEST_COOKIE:
                values.append(value)
    return values


def set_cookie(
    response: Response,
    request: Request,
    name: str,
    value: str,
    *,
    path: str,
    max_age: int | None = None,
) -> None:
    """Set one of the page's cookies on ``response`` as every one of them is set:
    HttpOnly, SameSite=Strict, Secure when ``request`` came over https, sent to
    ``path`` only; ``max_age`` None for a browser-session cookie."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=path,
    )
