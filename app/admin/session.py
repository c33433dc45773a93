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
"""

from __future__ import annotations

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
    "COOKIE_PATH",
    "LOGIN_COOKIE",
    "SESSION_MAX_AGE",
    "csrf_for",
    "is_current",
    "issue",
    "issued_at",
    "login_csrf_for",
    "login_nonce",
    "revoke",
    "set_cookie",
]

COOKIE = "regent_admin"
LOGIN_COOKIE = "regent_login"
COOKIE_PATH = "/admin"
SESSION_MAX_AGE = timedelta(hours=12)

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


def login_nonce(cookie: str | None) -> str:
    """The sign-in form's cookie value: the one the browser sent when it is one we make
    (a long URL-safe random), else a new one."""
    if cookie and 32 <= len(cookie) <= 64 and _URL_SAFE.fullmatch(cookie):
        return cookie
    return secrets.token_urlsafe(32)


def login_csrf_for(key: bytes, nonce: str) -> str:
    """The CSRF value of the sign-in form served with the cookie ``nonce``."""
    return _sign(key, "login", nonce)


def set_cookie(
    response: Response, request: Request, name: str, value: str, *, max_age: int | None = None
) -> None:
    """Set one of the page's cookies on ``response`` as every one of them is set:
    HttpOnly, SameSite=Strict, Secure when ``request`` came over https, sent to
    COOKIE_PATH only; ``max_age`` None for a browser-session cookie."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=COOKIE_PATH,
    )
