"""The headers of every answer under /admin: no caching, and no way to run, frame or
sniff anything.

The signed-in page lists jobs, outbox payloads and errors; a shared or browser cache
must not keep it, nor any other admin answer (a 401 or 404 included, so no cached
answer outlives a change of state): ``Cache-Control: no-store``. The page has no script
and its style is a file of its own (``/admin/admin.css``), so its Content-Security-Policy
allows no script at all, styles and images from the page's origin only, forms posted
back to it only, and no framing (``frame-ancestors 'none'``, clickjacking); the browser
must not guess a content type (``nosniff``) nor send the admin's URLs to another site
(``no-referrer``). A middleware, not a per-route header, so a new admin route and every
error answer are covered.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ADMIN_HEADERS", "AdminHeaders"]

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


class AdminHeaders:
    """ASGI middleware: adds ADMIN_HEADERS to /admin and /admin/... answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; mark the answer's headers when the path is an admin one."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != "/admin" and not path.startswith("/admin/"):
            await self.app(scope, receive, send)
            return

        async def send_guarded(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in ADMIN_HEADERS.items():
                    headers[name] = value
            await send(message)

        await self.app(scope, receive, send_guarded)
