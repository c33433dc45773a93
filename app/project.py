"""The user's project: the directory a command works for, found from the working
directory up as git and pytest find their root. The project's own migrations
(REGENT_MIGRATIONS) are taken from it, and an embedded data directory holds the
database of one project (app/embedded.py), so every command of a project, run from
anywhere inside it, finds the same migrations and the same database."""

from __future__ import annotations

from pathlib import Path

__all__ = ["dot_env_files", "project_root"]


def project_root(migrations: str | Path = "migrations", start: Path | None = None) -> Path:
    """The nearest directory, from ``start`` (default: the working directory) up, that
    holds the project's ``migrations`` (a relative path: their env.py) or a
    pyproject.toml; ``start`` itself when none does. Resolved (no symlinks)."""
    here = (start or Path.cwd()).resolve()
    return _marked_root(here, migrations) or here


def dot_env_files(start: Path | None = None) -> tuple[Path, ...]:
    """The ``.env`` files a command run in ``start`` (default: the working directory)
    reads, the later over the earlier: the project root's, then the nearest one from
    ``start`` up (no higher than a marked root; with none marked, as far up as one is
    found, as python-dotenv's find_dotenv looks), then ``start``'s own. Paths that do
    not exist are skipped by the reader; none repeats."""
    here = (start or Path.cwd()).resolve()
    root = _marked_root(here, "migrations")
    upward = (here, *here.parents)
    if root is not None:
        upward = upward[: upward.index(root) + 1]
    found = (directory / ".env" for directory in upward if (directory / ".env").is_file())
    nearest = next(found, None)
    files = [(root or here) / ".env", *([nearest] if nearest else []), here / ".env"]
    return tuple(dict.fromkeys(files))


def _marked_root(here: Path, migrations: str | Path) -> Path | None:
    relative = Path(migrations)
    looks_for_migrations = bool(str(migrations).strip()) and not relative.is_absolute()
    for candidate in (here, *here.parents):
        if looks_for_migrations and (candidate / relative / "env.py").is_file():
            return candidate
        if (candidate / "pyproject.toml").is_file():
            return candidate
    return None
