"""The admin dependency: a bearer token compared in constant time.

With no ADMIN_TOKEN configured the admin routes answer 404: there is never a default
credential. The token is never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from app.settings import Settings

__all__ = [
    "COOKIE",
    "AdminDep",
    "csrf_token",
    "require_admin",
    "session_valid",
    "session_value",
    "token_matches",
]

COOKIE = "regent_admin"


def token_matches(settings: Settings, offered: str | None) -> bool:
    """True when ``offered`` is the configured admin token (constant-time compare)."""
    if settings.ADMIN_TOKEN is None or not offered:
        return False
    expected = settings.ADMIN_TOKEN.get_secret_value().encode()
    return hmac.compare_digest(offered.encode(), expected)


def _derive(settings: Settings, purpose: str) -> str:
    assert settings.ADMIN_TOKEN is not None
    key = settings.ADMIN_TOKEN.get_secret_value().encode()
    return hmac.new(key, purpose.encode(), hashlib.sha256).hexdigest()


def session_value(settings: Settings) -> str:
    """The admin page's cookie value: derived from the token, never the token itself."""
    return _derive(settings, "regent-admin-session")


def session_valid(settings: Settings, cookie: str | None) -> bool:
    """True when ``cookie`` is the current session value (constant-time compare)."""
    if settings.ADMIN_TOKEN is None or not cookie:
        return False
    return hmac.compare_digest(cookie.encode(), session_value(settings).encode())


def csrf_token(settings: Settings) -> str:
    """The value every admin page form carries; a forged cross-site form lacks it."""
    return _derive(settings, "regent-admin-csrf")


def require_admin(request: Request) -> None:
    """Let the request through with ``Authorization: Bearer <ADMIN_TOKEN>``; 401
    otherwise; 404 when no token is configured. (The page uses its cookie; the API
    never does, so no cross-site form can drive it.)"""
    settings: Settings = request.app.state.settings
    if settings.ADMIN_TOKEN is None:
        raise HTTPException(404, "Not Found")
    header = request.headers.get("authorization", "")
    scheme, _, offered = header.partition(" ")
    if scheme.lower() == "bearer" and token_matches(settings, offered.strip()):
        return
    raise HTTPException(
        401,
        "admin routes need Authorization: Bearer <ADMIN_TOKEN>",
        headers={"WWW-Authenticate": "Bearer"},
    )


AdminDep = Annotated[None, Depends(require_admin)]
