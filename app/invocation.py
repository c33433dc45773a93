"""The command the user runs Regent by, for the hints that name one: `python -m regent`
in a project that imports Regent by that name, else this repository's `python -m app`.

`python -m regent` records itself in the environment (``COMMAND_VARIABLE``) before it
runs, so that the processes it starts (uvicorn's spawned server workers, whose main
module is not `regent.__main__`) name it too."""

from __future__ import annotations

import os

__all__ = ["COMMAND_VARIABLE", "program"]

COMMAND_VARIABLE = "REGENT_COMMAND"
"""Set by `python -m regent` for itself and every process it starts."""


def program() -> str:
    """The command hints name: ``python -m regent`` in a process `python -m regent`
    started (itself included), else ``python -m app``."""
    return os.environ.get(COMMAND_VARIABLE) or "python -m app"
