"""The command the user runs Regent by, for the hints that name one: `python -m regent`
in a process started so (a project of one's own, and the server workers it spawns),
else this repository's `python -m app`."""

from __future__ import annotations

import sys

__all__ = ["program"]


def program() -> str:
    """``python -m regent`` when this process's main module is Regent's ``regent`` (a
    spawned server worker's main module is its parent's), else ``python -m app``."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    started_as = (getattr(spec, "name", None) or "").partition(".")[0]
    return "python -m regent" if started_as == "regent" else "python -m app"
