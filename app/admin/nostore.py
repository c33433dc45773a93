"""``Cache-Control: no-store`` on every answer under /admin.

The signed-in page lists jobs, outbox payloads and errors; a shared or browser cache
must not keep it, nor any other admin answer (a 401 or 404 included, so no cached
answer outlives a change of state). A middleware, not a per-route header, so a new
admin route and every error answer are covered.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["NoStoreAdmin"]


class NoStoreAdmin:
    """ASGI middleware: adds ``Cache-Control: no-store`` to /admin and /admin/... answers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Pass the request on; mark the answer's headers when the path is an admin one."""
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if path != "/admin" and not path.startswith("/admin/"):
            await self.app(scope, receive, send)
            return

        async def send_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_no_store)
