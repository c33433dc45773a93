"""The admin dependency: a bearer token compared in constant time.

With no ADMIN_TOKEN configured the admin routes answer 404: there is never a default
credential. The token is never logged.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from app.settings import Settings

__all__ = ["COOKIE", "AdminDep", "require_admin", "token_matches"]

COOKIE = "regent_admin"


def token_matches(settings: Settings, offered: str | None) -> bool:
    """True when ``offered`` is the configured admin token (constant-time compare)."""
    if settings.ADMIN_TOKEN is None or not offered:
        return False
    expected = settings.ADMIN_TOKEN.get_secret_value().encode()
    return hmac.compare_digest(offered.encode(), expected)


def require_admin(request: Request) -> None:
    """Let the request through with ``Authorization: Bearer <ADMIN_TOKEN>`` (or the admin
    page's cookie); 401 otherwise; 404 when no token is configured."""
    settings: Settings = request.app.state.settings
    if settings.ADMIN_TOKEN is None:
        raise HTTPException(404, "Not Found")
    header = request.headers.get("authorization", "")
    scheme, _, offered = header.partition(" ")
    if scheme.lower() == "bearer" and token_matches(settings, offered.strip()):
        return
    if token_matches(settings, request.cookies.get(COOKIE)):
        return
    raise HTTPException(
        401,
        "admin routes need Authorization: Bearer <ADMIN_TOKEN>",
        headers={"WWW-Authenticate": "Bearer"},
    )


AdminDep = Annotated[None, Depends(require_admin)]
