"""The user's app that `python -m app` serves and commands: REGENT_APP, or --app.

``create_app(settings, scheduler)`` keeps its Scheduler on the app's state. A
deployment often serves that app inside ASGI middleware (``GZipMiddleware(app)``, a
tracing or proxy-headers wrapper), each of which keeps the app it wraps as ``.app``;
the scheduler is found by following that chain.
"""

from __future__ import annotations

import inspect
from typing import Final

from .scheduler import Scheduler

__all__ = ["DEFAULT_APP", "AppTargetError", "find_scheduler", "load_scheduler"]

DEFAULT_APP: Final = "app.main:app"
# Deeper than any real middleware stack; a wrapper whose ``.app`` leads round in a
# circle (or an object that answers every attribute) ends the walk here.
_MAX_WRAPPERS = 64


class AppTargetError(Exception):
    """--app (or REGENT_APP) does not name an importable ASGI app with a Regent scheduler."""


def find_scheduler(app: object) -> Scheduler | None:
    """The Scheduler that ``create_app(...)`` kept on ``app``'s state, or on the state of
    the app that ASGI middleware wraps (``.app``, followed through every layer); None
    when no layer has one."""
    layer: object = app
    for _ in range(_MAX_WRAPPERS):
        scheduler = getattr(getattr(layer, "state", None), "scheduler", None)
        if isinstance(scheduler, Scheduler):
            return scheduler
        inner = getattr(layer, "app", None)
        if inner is None or inner is layer:
            return None
        layer = inner
    return None


def load_scheduler(target: str, option: str) -> Scheduler:
    """Import the ASGI app ``target`` (module:attribute) and return its Scheduler.

    Raises AppTargetError, in one line naming ``option`` (``--app`` or ``REGENT_APP``)
    and ``target``, when it cannot be imported, is not an ASGI app, or has no Regent
    scheduler (an app that would serve but fire no job).
    """
    from uvicorn.importer import ImportFromStringError, import_from_string

    try:
        app = import_from_string(target)
    except ImportFromStringError as exc:
        raise AppTargetError(f"{option}={target!r}: {exc}") from None
    except Exception as exc:
        # One line: a multi-line message (a pydantic ValidationError) keeps its first.
        lines = str(exc).splitlines() or [""]
        more = f" (+{len(lines) - 1} more lines)" if len(lines) > 1 else ""
        raise AppTargetError(
            f"{option}={target!r}: importing it raised {exc.__class__.__name__}: {lines[0]}{more}"
        ) from None
    if inspect.isclass(app) or not callable(app):
        raise AppTargetError(
            f"{option}={target!r} is a {type(app).__name__}, not an ASGI app; point it at "
            "the object create_app(...) returned"
        )
    scheduler = find_scheduler(app)
    if scheduler is None:
        raise AppTargetError(
            f"{option}={target!r} is an ASGI app without a Regent scheduler, so no job would "
            "run; build it with create_app(scheduler=scheduler) around your Scheduler()"
        )
    return scheduler
