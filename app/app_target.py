"""The user's app that `python -m app` serves and commands: REGENT_APP, or --app.

``create_app(settings, scheduler)`` keeps its Scheduler, and the Settings it was built
with, on the app's state. A deployment often serves that app inside ASGI middleware;
the scheduler is found through the ways a wrapper can keep the app it wraps:

- ``.app``: Starlette's middleware and most ASGI wrappers (``GZipMiddleware(app)``);
- ``__wrapped__``: a wrapper made with ``functools.wraps(app)``;
- a closure's variables: ``def middleware(app): async def asgi(...): ...`` (a plain
  function's captured values, followed when callable).

A wrapper that keeps the app anywhere else (a private attribute of its own class) is
not followed: the error says to expose it as ``.app`` or to name the schedule
(``--schedule``).
"""

from __future__ import annotations

import inspect
from collections import deque
from dataclasses import dataclass
from typing import Final

from .scheduler import Scheduler
from .settings import Settings

__all__ = [
    "DEFAULT_APP",
    "AppScheduler",
    "AppTargetError",
    "find_schedulers",
    "load_scheduler",
    "load_schedulers",
]

DEFAULT_APP: Final = "app.main:app"
# More layers than any real middleware stack holds; a wrapper whose links lead round in
# a circle (or an object that answers every attribute) ends the walk here.
_MAX_LAYERS = 256


class AppTargetError(Exception):
    """--app (or REGENT_APP) does not name an importable ASGI app with a Regent scheduler."""


@dataclass(frozen=True)
class AppScheduler:
    """The Scheduler an app runs, and the Settings the app was built with (None for an
    app whose state holds no Settings: it was not built by create_app)."""

    scheduler: Scheduler
    settings: Settings | None

    def schedule(self, default: str) -> str:
        """The schedule the app runs: its Scheduler's own name, else the SCHEDULER_NAME
        of the Settings the app was built with (create_app starts it so), else
        ``default`` (the caller's SCHEDULER_NAME)."""
        if self.scheduler.name_is_set:
            return self.scheduler.name
        if self.settings is not None:
            return self.settings.SCHEDULER_NAME
        return default


def _inner_layers(layer: object) -> list[object]:
    # The ways a wrapper keeps the app it wraps (see the module's docstring).
    inner = [getattr(layer, "app", None), getattr(layer, "__wrapped__", None)]
    if inspect.isfunction(layer) and layer.__closure__:
        for cell in layer.__closure__:
            try:
                inner.append(cell.cell_contents)
            except ValueError:  # a variable not yet bound
                continue
    return [value for value in inner if value is not None and callable(value)]


def find_schedulers(app: object) -> list[AppScheduler]:
    """The Schedulers that ``create_app(...)`` kept on ``app``'s state, or on the state
    of the apps that ``app`` wraps as ASGI middleware (through ``.app``, ``__wrapped__``
    or a closure's variables, layer after layer), each with the Settings kept beside
    it, the outermost first; empty when no layer has one. More than one: the app
    dispatches to several Regent apps, each running its own schedule."""
    found: dict[int, AppScheduler] = {}
    seen = {id(app)}
    layers: deque[object] = deque([app])
    while layers and len(seen) <= _MAX_LAYERS:
        layer = layers.popleft()
        state = getattr(layer, "state", None)
        scheduler = getattr(state, "scheduler", None)
        if isinstance(scheduler, Scheduler):
            settings = getattr(state, "settings", None)
            found.setdefault(
                id(scheduler),
                AppScheduler(scheduler, settings if isinstance(settings, Settings) else None),
            )
            continue  # the layers under a Regent app are its own, not another's
        for inner in _inner_layers(layer):
            if id(inner) not in seen:
                seen.add(id(inner))
                layers.append(inner)
    return list(found.values())


def load_schedulers(target: str, option: str) -> list[AppScheduler]:
    """Import the ASGI app ``target`` (module:attribute) and return its Schedulers
    (find_schedulers: one, unless it dispatches to several Regent apps).

    Raises AppTargetError, in one line naming ``option`` (``--app`` or ``REGENT_APP``)
    and ``target``, when it cannot be imported (its import raises, or exits with
    SystemExit), is not an ASGI app, or has no Regent scheduler that can be found (an
    app that would serve but fire no job, or one inside middleware that hides it).
    """
    from uvicorn.importer import ImportFromStringError, import_from_string

    try:
        app = import_from_string(target)
    except ImportFromStringError as exc:
        raise AppTargetError(f"{option}={target!r}: {exc}") from None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        # Whatever ends the import (a SystemExit of the user's own start-up checks too)
        # is an import error: one line, never a traceback or a silent exit. One line: a
        # multi-line message (a pydantic ValidationError) keeps its first.
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
    found = find_schedulers(app)
    if not found:
        raise AppTargetError(
            f"{option}={target!r} is an ASGI app without a Regent scheduler that can be "
            "found, so no job would run; build it with create_app(scheduler=scheduler) "
            "around your Scheduler(), and if middleware wraps it, let the middleware keep "
            "it as .app (or make it with functools.wraps); the jobs and leader commands "
            "also take --schedule NAME"
        )
    return found


def load_scheduler(target: str, option: str) -> AppScheduler:
    """load_schedulers() of an app that runs one schedule: its Scheduler, with the
    Settings the app was built with. Raises AppTargetError as load_schedulers does,
    and when the app dispatches to several Regent apps (no one schedule to act on)."""
    found = load_schedulers(target, option)
    if len(found) > 1:
        names = ", ".join(sorted(each.scheduler.name for each in found))
        raise AppTargetError(
            f"{option}={target!r} wraps {len(found)} Regent schedulers ({names}), so it "
            "runs no one schedule; pass --schedule NAME"
        )
    return found[0]
