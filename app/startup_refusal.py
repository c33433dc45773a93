"""A start-up Regent refuses, told in one line under any ASGI server.

The lifespan refuses to start on a database it cannot use or an outbox set up wrong,
with a message that names the setting and the fix. Starlette reports a lifespan's
exception to the server as its whole traceback (forty lines through starlette's and
FastAPI's frames under plain `uvicorn app.main:app`), with that message at the end. The
lifespan records the refusal on the app's state (``refuse_start``) and this middleware
sends the server the message alone; the server still exits non-zero (uvicorn: 3).
A failure that is not a refusal (a bug) keeps its traceback.
"""

from __future__ import annotations

from starlette.datastructures import State
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["OneLineStartupRefusal", "refuse_start"]

_REFUSAL = "startup_refusal"


def refuse_start(state: State, reason: BaseException) -> None:
    """Record on the app's ``state`` that start-up is refused for ``reason`` (whose
    message says what to fix); the caller then raises it out of the lifespan."""
    setattr(state, _REFUSAL, "regent: cannot start: " + " ".join(str(reason).split()))


class OneLineStartupRefusal:
    """Pure ASGI middleware: a failed lifespan start-up that ``refuse_start`` recorded
    reaches the server as that one line instead of a traceback. Every other message,
    and every HTTP and WebSocket scope, passes through unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def send_refusal_alone(message: Message) -> None:
            if message["type"] == "lifespan.startup.failed":
                refusal = getattr(scope["app"].state, _REFUSAL, None)
                if refusal is not None:
                    message = {**message, "message": refusal}
            await send(message)

        await self.app(scope, receive, send_refusal_alone)
