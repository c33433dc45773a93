"""A user's app of schedule ``wrapped`` served inside middleware of the shapes people
write: a plain closure, a closure marked with functools.wraps, and a class that keeps
the app it wraps under a private name (which no tool can know to follow)."""

import functools
from typing import Any

from app.main import create_app
from app.scheduler import JobContext, Scheduler, every
from app.settings import load_settings

scheduler = Scheduler(name="wrapped")


@scheduler.job(every(hours=1), id="report")
async def report(ctx: JobContext) -> None:
    return None


app = create_app(load_settings(_env_file=None), scheduler)


def _closure(inner: Any) -> Any:
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        await inner(scope, receive, send)

    return asgi


def _marked(inner: Any) -> Any:
    @functools.wraps(inner)
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        await inner(scope, receive, send)

    return asgi


class _Opaque:
    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._inner(scope, receive, send)


closure = _closure(app)
marked = _marked(app)
# Middleware inside middleware: a closure around a closure.
nested = _closure(_closure(app))
opaque = _Opaque(app)


def _by_path(first: Any, second: Any) -> Any:
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        await (second if scope["path"].startswith("/other") else first)(scope, receive, send)

    return asgi


# Two Regent apps of two schedules behind one dispatcher: no one schedule to act on.
two_schedules = _by_path(app, create_app(load_settings(_env_file=None), Scheduler(name="other")))
