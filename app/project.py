"""The user's project: the directory a command works for, found from the working
directory up as git and pytest find their root. The project's own migrations
(REGENT_MIGRATIONS) are taken from it, and an embedded data directory holds the
database of one project (app/embedded.py), so every command of a project, run from
anywhere inside it, finds the same migrations and the same database."""

from __future__ import annotations

from pathlib import Path

__all__ = ["project_root"]


def project_root(migrations: str | Path = "migrations", start: Path | None = None) -> Path:
    """The nearest directory, from ``start`` (default: the working directory) up, that
    holds the project's ``migrations`` (a relative path: their env.py) or a
    pyproject.toml; ``start`` itself when none does. Resolved (no symlinks)."""
    here = (start or Path.cwd()).resolve()
    relative = Path(migrations)
    looks_for_migrations = bool(str(migrations).strip()) and not relative.is_absolute()
    for candidate in (here, *here.parents):
        if looks_for_migrations and (candidate / relative / "env.py").is_file():
            return candidate
        if (candidate / "pyproject.toml").is_file():
            return candidate
    return here
