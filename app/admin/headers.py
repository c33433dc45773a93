"""The security headers of every answer: the admin's strict set under /admin, a base set
everywhere else.

The signed-in page lists jobs, outbox payloads and errors; a shared or browser cache
must not keep it, nor any other admin answer (a 401 or 404 included, so no cached
answer outlives a change of state): ``Cache-Control: no-store``. The page has no script
and its style is a file of its own (``/admin/admin.css``), so its Content-Security-Policy
allows no script at all, styles and images from the page's origin only, forms posted
back to it only, and no framing (``frame-ancestors 'none'``, clickjacking); the browser
must not guess a content type (``nosniff``) nor send the admin's URLs to another site
(``no-referrer``).

Every other answer (health, metrics, the schema, the example API, a 404, a user's own
routes) gets ``nosniff``, ``no-referrer`` and a policy of ``frame-ancestors 'none'``,
each only where the route set none of its own, so a user's route that wants to be
framed or referred says so and is obeyed.

SecurityHeaders wraps the whole application, outside Starlette's error middleware
(RegentAPI.build_middleware_stack), so a 500 carries them too; it decides what is an
admin path as the router does, after the root path a proxy set-up strips
(``--root-path``).
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ADMIN_HEADERS", "BASE_HEADERS", "SecurityHeaders"]

ADMIN_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
BASE_HEADERS = {
    "Content-Security-Policy": "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _route_path(scope: Scope) -> str:
    """The path the router matches: the request's, less the root path (as Starlette's
    routing takes it off)."""
    path: str = scope.get("path", "")
    root_path: str = scope.get("root_path", "")
    return path[len(root_path) :] if root_path and path.startswith(root_path) else path


class SecurityHeaders:
    """ASGI middleware: ADMIN_HEADERS on /admin and /admin/... answers (replacing what a
    route set), BASE_HEADERS on every other answer (where the route set none)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; add the headers to its answer's start."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _route_path(scope)
        admin = path == "/admin" or path.startswith("/admin/")

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in (ADMIN_HEADERS if admin else BASE_HEADERS).items():
                    if admin or name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_guarded)
