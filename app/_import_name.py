"""Whether the name ``app`` is Regent's: the check `import regent` makes first (loading
this file by its path) and `import app` makes as it begins.

Regent's import package is ``app``, installed beside this one. A project of one's own
with a top-level ``app`` of its own (FastAPI's "Bigger Applications" layout) takes the
name: `python -m ...` and uvicorn put the current directory first on ``sys.path``, so
``import app`` finds the project's package and none of Regent's code can be imported in
that process. Without this check the user reads an ImportError about a module missing
from their own package; with it, one line naming both and the fix. A project's ``app/``
without ``__init__.py`` is refused too: Python passes over it for Regent's regular
package, and Regent's ``app.main`` would be served in place of the project's.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

__all__ = ["ShadowedAppError", "refuse_a_shadowed_app"]

# uvicorn.config.STARTUP_FAILURE, without importing uvicorn for it.
_STARTUP_FAILURE = 3


class ShadowedAppError(SystemExit):
    """Raised by `import regent` when the name ``app`` is not Regent's package, once its
    message is on stderr.

    A SystemExit, not an ImportError: nothing of Regent can run in this process, and a
    server that imports the user's module (uvicorn) would print an ImportError inside
    forty lines of its own frames; a SystemExit ends the process quietly. Its status is
    3, uvicorn's start-up failure, on which uvicorn's supervisor stops instead of
    restarting its workers for ever. ``found`` is what ``app`` names, ``regents``
    Regent's own package; ``str()`` is the message.
    """

    def __init__(self, found: Path, regents: Path) -> None:
        super().__init__(_STARTUP_FAILURE)
        self.found = found
        self.regents = regents
        self.message = (
            f"regent: error: `import app` finds {found}, not Regent's package {regents} "
            "(Regent's import name is `app`), so Regent cannot run here; rename your own "
            "`app` (e.g. to `myapp`, and its imports) and start again"
        )

    def __str__(self) -> str:
        return self.message


def refuse_a_shadowed_app(regents: Path) -> None:
    """Print ShadowedAppError's one line on stderr and raise it when ``import app`` would
    not (or did not) import the package at ``regents``. Looks the name up without
    importing it; says nothing when it is not found at all (the import that follows
    then names it)."""
    spec = importlib.util.find_spec("app")
    if spec is None:
        return
    if spec.origin is not None:
        found = Path(spec.origin).resolve()
        if spec.submodule_search_locations is not None:  # a package: named by its directory
            found = found.parent
    else:  # a namespace package: directories only, so no regular `app` (Regent's) was found
        found = Path(next(iter(spec.submodule_search_locations or ()), "")).resolve()
    if found == regents.resolve():
        found = _namespace_app_before(regents.resolve().parent) or found
    if found != regents.resolve():
        error = ShadowedAppError(found, regents.resolve())
        # Printed here: Python prints nothing for a SystemExit with a status.
        print(error.message, file=sys.stderr)
        raise error


def _namespace_app_before(installed_in: Path) -> Path | None:
    """A directory ``app`` of Python code without ``__init__.py`` in the working
    directory, when that comes on ``sys.path`` before ``installed_in`` (where Regent's
    ``app`` is): the project's own package, which Python passes over for Regent's
    regular one (``app.main`` would be Regent's). Only the working directory: that is
    where `python -m`, uvicorn and a project's scripts start from; another entry (a test
    directory pytest puts first) holding an ``app/`` of test modules names no package
    anyone imports as ``app``."""
    here = Path.cwd().resolve()
    for entry in sys.path:
        directory = Path(entry or ".").resolve()
        if directory == installed_in:
            return None
        if directory != here:
            continue
        candidate = directory / "app"
        # Python code in it (modules, or packages only): not any directory of that name
        # (a web front end's app/ of .tsx files).
        if not (candidate / "__init__.py").exists() and (
            any(candidate.glob("*.py")) or any(candidate.glob("*/__init__.py"))
        ):
            return candidate
    return None
