"""The example routes' guard: ``Authorization: Bearer <API_TOKEN>``.

``POST /api/credits/grants`` grants credits to any workspace and ``GET /api/stats``
reads any workspace's figures, so neither may be open: with no API_TOKEN configured
they answer 404 like a route that does not exist, and with one, anything but that
token gets 401 (429 once its client has sent too many wrong ones: the admin's throttle,
app/admin/throttle.py) before the body is read. The token is separate from
ADMIN_TOKEN: a service that grants credits gets no admin rights.
"""

from __future__ import annotations

from fastapi import Request

from app.admin.auth import key_of, require_bearer
from app.settings import Settings

__all__ = ["require_api_token"]


async def require_api_token(request: Request) -> None:
    """require_bearer (app/admin/auth.py) with API_TOKEN: 404 while it is unset."""
    settings: Settings = request.app.state.settings
    await require_bearer(request, key_of(settings.API_TOKEN), "API_TOKEN")
