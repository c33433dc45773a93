"""The example routes' guard: ``Authorization: Bearer <API_TOKEN>``.

``POST /api/credits/grants`` grants credits to any workspace and ``GET /api/stats``
reads any workspace's figures, so neither may be open: with no API_TOKEN configured
they answer 404 like a route that does not exist, and with one, anything but that
token gets 401 before the body is read. The token is separate from ADMIN_TOKEN: a
service that grants credits gets no admin rights.
"""

from __future__ import annotations

from fastapi import HTTPException, Request

from app.admin.auth import token_matches
from app.settings import ADMIN_TOKEN_MIN_LENGTH, Settings

__all__ = ["require_api_token"]


def require_api_token(request: Request) -> None:
    """Let the request through with ``Authorization: Bearer <API_TOKEN>``; 401
    otherwise; 404 when no API_TOKEN is configured."""
    settings: Settings = request.app.state.settings
    token = settings.API_TOKEN.get_secret_value() if settings.API_TOKEN is not None else ""
    # A token too short to be a key (refused by Settings, but a copied Settings skips
    # validation) counts as none.
    if len(token.strip()) < ADMIN_TOKEN_MIN_LENGTH:
        raise HTTPException(404, "Not Found")
    scheme, _, offered = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token_matches(token.encode(), offered.strip()):
        return
    raise HTTPException(
        401,
        "this route needs Authorization: Bearer <API_TOKEN>",
        headers={"WWW-Authenticate": "Bearer"},
    )
