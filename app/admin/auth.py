"""The admin dependency: a bearer token compared in constant time.

With no ADMIN_TOKEN configured the admin routes answer 404: there is never a default
credential. A token too short to be a key (settings refuse one; a Settings built past
validation could still carry it) counts as none. The token is never logged.
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from app.settings import ADMIN_TOKEN_MIN_LENGTH, Settings

__all__ = ["AdminDep", "admin_key", "require_admin", "token_matches"]


def admin_key(settings: Settings) -> bytes | None:
    """The admin token as the key the admin signs with; None when the admin is off."""
    if settings.ADMIN_TOKEN is None:
        return None
    token = settings.ADMIN_TOKEN.get_secret_value()
    if len(token.strip()) < ADMIN_TOKEN_MIN_LENGTH:
        return None
    return token.encode()


def token_matches(key: bytes, offered: str | None) -> bool:
    """True when ``offered`` is the admin token ``key`` (constant-time compare)."""
    if not offered:
        return False
    return hmac.compare_digest(offered.encode("utf-8", "surrogatepass"), key)


def require_admin(request: Request) -> None:
    """Let the request through with ``Authorization: Bearer <ADMIN_TOKEN>``; 401
    otherwise; 404 when no token is configured. (The page uses its cookie; the API
    never does, so no cross-site form can drive it.)"""
    key = admin_key(request.app.state.settings)
    if key is None:
        raise HTTPException(404, "Not Found")
    header = request.headers.get("authorization", "")
    scheme, _, offered = header.partition(" ")
    if scheme.lower() == "bearer" and token_matches(key, offered.strip()):
        return
    raise HTTPException(
        401,
        "admin routes need Authorization: Bearer <ADMIN_TOKEN>",
        headers={"WWW-Authenticate": "Bearer"},
    )


AdminDep = Annotated[None, Depends(require_admin)]
