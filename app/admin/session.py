"""Admin page sessions: a signed cookie carrying its issue time, revoked by a "not
before" kept in the database.

The sign-in form is guarded the same way before there is a session: the form's page
sets a random ``regent_login`` cookie (HttpOnly, SameSite=Strict) and carries a CSRF
value derived from it, and a sign-in without both is refused before its token is read:
a form posted from another site carries neither, so it can neither sign the admin in as
someone else nor spend the admin's address's wrong tokens (throttle.py).

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
opens nothing elsewhere. The sign-in form and its cookie stay at ``/admin``. Such a
server can also set cookies of these names for the whole host, which the browser then
sends beside ours: every value sent is looked at (``cookie_values``), so one tossed in
neither opens a session nor hides the form's own (it would otherwise lock the admin out
of signing in).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
from datetime import UTC, datetime, timedelta

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request
from starlette.responses import Response

from app.scheduler.clock import LEASE_NOW_SQL

__all__ = [
    "COOKIE",
    "LOGIN_COOKIE",
    "SESSION_MAX_AGE",
    "admin_path",
    "cookie_values",
    "csrf_for",
    "is_current",
    "issue",
    "issued_at",
    "login_csrf_for",
    "login_csrf_matches",
    "login_nonce",
    "revoke",
    "session_cookie",
    "session_path",
    "set_cookie",
    "sid_for",
]

COOKIE = "regent_admin"
LOGIN_COOKIE = "regent_login"
SESSION_MAX_AGE = timedelta(hours=12)
# Bytes of the HMAC a sid keeps: 128 bits, 22 URL-safe characters.
_SID_BYTES = 16

_URL_SAFE = re.compile(r"[A-Za-z0-9_-]+")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LONGEST_COOKIE = 100

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


def issue(key: bytes, now: datetime) -> str:
    """A new session cookie value, issued at ``now`` (on the lease clock:
    reading.lease_clock_now)."""
    micros = str((now - _EPOCH) // timedelta(microseconds=1))
    return f"{micros}.{_sign(key, 'session', micros)}"


def issued_at(key: bytes, cookie: str | None) -> datetime | None:
    """When a correctly signed cookie was issued; None for anything else."""
    if not cookie or len(cookie) > _LONGEST_COOKIE:
        return None
    micros, _, signature = cookie.partition(".")
    expected = _sign(key, "session", micros)
    if not micros.isascii() or not micros.isdigit():
        return None
    if not hmac.compare_digest(signature.encode("utf-8", "replace"), expected.encode()):
        return None
    return _EPOCH + timedelta(microseconds=int(micros))


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
    for value in cookie_values(request, COOKIE):
        if hmac.compare_digest(sid_for(key, value).encode(), wanted):
            return value
    return None


def cookie_values(request: Request, name: str) -> list[str]:
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


def login_nonce(sent: list[str]) -> str:
    """The sign-in form's cookie value: the first the browser sent that is one we make
    (a long URL-safe random), else a new one."""
    for cookie in sent:
        if 32 <= len(cookie) <= 64 and _URL_SAFE.fullmatch(cookie):
            return cookie
    return secrets.token_urlsafe(32)


def login_csrf_matches(request: Request, key: bytes, csrf: str) -> bool:
    """Whether ``csrf`` is the sign-in form's CSRF value for one of the sign-in cookies
    the request carries (every one sent is looked at: one tossed by another server of
    the host for a wider path neither passes nor hides the form's own)."""
    given = csrf.encode("utf-8", "replace")
    return any(
        hmac.compare_digest(given, login_csrf_for(key, nonce).encode())
        for nonce in cookie_values(request, LOGIN_COOKIE)
    )


def login_csrf_for(key: bytes, nonce: str) -> str:
    """The CSRF value of the sign-in form served with the cookie ``nonce``."""
    return _sign(key, "login", nonce)


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
