"""``/``: where an operator lands. The admin page when it is on; otherwise a short
index of the routes there are to look at, and how to turn the page on."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response

from .auth import admin_key
from .session import admin_path

__all__ = ["ADMIN_OFF", "ROUTES", "router"]

router = APIRouter(include_in_schema=False)

ROUTES = {
    "/healthz": "200 while the process lives",
    "/readyz": "200 when the database is reachable and at head",
    "/health/scheduler": "200 with a leader and every job fresh; 503 listing stale jobs",
    "/metrics": "Prometheus metrics of every worker",
}
ADMIN_OFF = (
    "off: ADMIN_TOKEN is unset; set it (32+ characters: `openssl rand -hex 32`) to serve "
    "the admin page at /admin"
)


@router.get("/")
async def index(request: Request) -> Response:
    """Redirect to /admin (after the root path) when ADMIN_TOKEN is set; else name the
    routes and the setting."""
    if admin_key(request.app.state.settings) is not None:
        return RedirectResponse(admin_path(request))
    return JSONResponse({"service": "regent", "routes": ROUTES, "admin": ADMIN_OFF})
