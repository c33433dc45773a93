"""The bearer-token guard of the admin API and the example API, compared in constant
time and throttled per client (throttle.py).

With no token configured the guarded routes answer 404: there is never a default
credential. A token too short to be a key (settings refuse one; a Settings built past
validation could still carry it) counts as none. The token is never logged.

A guarded router declares its token as a bearer security scheme named after the
setting (``bearer_scheme``) and the guard's answers (``guard_responses``), so the
OpenAPI schema tells a client which token each route takes and what a refusal looks
like.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPBearer
from pydantic import SecretStr

from app.db import Database
from app.http_errors import error_response
from app.scheduler import Clock
from app.scheduler.clock import lease_now
from app.settings import ADMIN_TOKEN_MIN_LENGTH, Settings

from . import throttle

__all__ = [
    "AdminDep",
    "admin_key",
    "bearer_scheme",
    "client_address",
    "guard_responses",
    "key_of",
    "refuse_wrong_token",
    "require_admin",
    "require_bearer",
    "token_matches",
]


def bearer_scheme(setting: str) -> HTTPBearer:
    """The OpenAPI security scheme of ``Authorization: Bearer <setting>``, named after
    the setting. As a dependency it only declares the scheme: require_bearer checks."""
    return HTTPBearer(
        scheme_name=setting,
        description=f"Authorization: Bearer <{setting}>",
        auto_error=False,
    )


def guard_responses(setting: str) -> dict[int | str, dict[str, Any]]:
    """The answers of require_bearer for ``setting``, as a router's ``responses=``."""
    return {
        401: error_response(
            f"no Authorization: Bearer <{setting}>, or a wrong token",
            headers={"WWW-Authenticate": "Bearer"},
        ),
        404: error_response(f"{setting} is unset: the routes are off"),
        429: error_response(
            "too many wrong tokens from this client; wait before the next try",
            headers={"Retry-After": "seconds to wait"},
        ),
    }


def key_of(token: SecretStr | None) -> bytes | None:
    """A configured token as the key it is compared with; None when it is unset or too
    short to be a key."""
    if token is None:
        return None
    value = token.get_secret_value()
    if len(value.strip()) < ADMIN_TOKEN_MIN_LENGTH:
        return None
    return value.encode()


def admin_key(settings: Settings) -> bytes | None:
    """The admin token as the key the admin signs with; None when the admin is off."""
    return key_of(settings.ADMIN_TOKEN)


def token_matches(key: bytes, offered: str | None) -> bool:
    """True when ``offered`` is the token ``key`` (constant-time compare)."""
    if not offered:
        return False
    return hmac.compare_digest(offered.encode("utf-8", "surrogatepass"), key)


# The longest address text a client is counted under as it is (an IPv6 address with a
# zone is ~60 characters); a longer one is counted under its digest.
_LONGEST_ADDRESS = 64


def client_address(request: Request) -> str:
    """The address the throttle counts a request against: the peer's, or the one a
    proxy named in TRUSTED_PROXIES forwarded (uvicorn's proxy headers, configured by
    `python -m app`). A forwarded value is any text a client put in X-Forwarded-For:
    one longer than an address is counted under ``sha256:<its digest>``, so it fits the
    count's index and is still counted, always under the same name."""
    address = request.client.host if request.client else "unknown"
    if len(address) <= _LONGEST_ADDRESS:
        return address
    return "sha256:" + hashlib.sha256(address.encode("utf-8", "surrogatepass")).hexdigest()


async def refuse_wrong_token(request: Request) -> int:
    """Count a wrong token from this request's client (throttle.py); 0 to answer 401,
    else the seconds to put in a 429's Retry-After."""
    database: Database = request.app.state.database
    clock: Clock = request.app.state.clock
    return await throttle.count_wrong_token(
        database.engine, client_address(request), lease_now(clock)
    )


async def require_bearer(request: Request, key: bytes | None, setting: str) -> None:
    """Let the request through with ``Authorization: Bearer <token>`` for ``key`` (the
    token of ``setting``); 404 when ``key`` is None (the routes are off); 401 for a
    missing or wrong token; 429 with Retry-After for a wrong one from a client that
    must wait (the right token always passes)."""
    if key is None:
        raise HTTPException(404, "Not Found")
    header = request.headers.get("authorization")
    scheme, _, offered = (header or "").partition(" ")
    if scheme.lower() == "bearer" and token_matches(key, offered.strip()):
        return
    # A request offering no credential guesses nothing: only offered ones are counted.
    wait = await refuse_wrong_token(request) if header else 0
    if wait:
        raise HTTPException(
            429,
            f"too many wrong tokens from this address; wait {wait} s before the next try",
            headers={"Retry-After": str(wait)},
        )
    raise HTTPException(
        401,
        f"this route needs Authorization: Bearer <{setting}>",
        headers={"WWW-Authenticate": "Bearer"},
    )


async def require_admin(request: Request) -> None:
    """The admin API's guard: require_bearer with ADMIN_TOKEN. (The page uses its
    cookie; the API never does, so no cross-site form can drive it.)"""
    await require_bearer(request, admin_key(request.app.state.settings), "ADMIN_TOKEN")


AdminDep = Annotated[None, Depends(require_admin)]
