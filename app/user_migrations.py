"""The application's own migrations: an alembic project beside Regent's.

A project keeps its own tables as alembic revisions in ``migrations/`` (the
``REGENT_MIGRATIONS`` setting, relative to the project's root: the nearest directory,
from the one the app starts in up, that holds them or a pyproject.toml). `python -m
app revision -m "..."` writes the project the first time and each revision after the
head of its chain; `python -m app migrate` applies Regent's migrations, then these; the
app's boot check and ``/readyz`` check both. A REGENT_MIGRATIONS the user set that
names no migrations is refused by `migrate` and start-up (`configured_migrations`).
The chains never meet: Regent's revision is kept in ``regent_alembic_version``, the
project's in alembic's default ``alembic_version``, so a project that ran its own
alembic before keeps its history.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from .invocation import program
from .migration_env import USER_VERSION_TABLE
from .project import project_root
from .settings import Settings, SettingsError

__all__ = ["UserMigrations", "configured_migrations", "user_migrations"]

_SCRIPT_TEMPLATE = Path(__file__).resolve().parent / "migrations" / "script.py.mako"

_ENV_PY = '''"""This project's own migrations: `{program} migrate` applies them after Regent's
(under the same migration lock); their revision is kept in alembic_version.
`{program} revision -m "..."` adds one after the head."""

from app.migration_env import run_users_migrations

run_users_migrations()
'''


class UserMigrations:
    """The alembic project of an application's own tables, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()

    def __repr__(self) -> str:
        return f"UserMigrations({str(self.directory)!r})"

    @property
    def exists(self) -> bool:
        """Whether the project has been made (its ``env.py`` is there)."""
        return (self.directory / "env.py").is_file()

    def config(self, sqlalchemy_url: str | None = None) -> Config:
        """Alembic configuration of the project, optionally bound to a SQLAlchemy URL."""
        config = Config()
        config.set_main_option("script_location", str(self.directory))
        if sqlalchemy_url is not None:
            # configparser treats % as interpolation; a password may contain one.
            config.set_main_option("sqlalchemy.url", sqlalchemy_url.replace("%", "%%"))
        return config

    def heads(self) -> set[str]:
        """The head revisions of the project's chain (empty before its first revision)."""
        return set(ScriptDirectory.from_config(self.config()).get_heads())

    @staticmethod
    def current(connection: Connection) -> set[str]:
        """The revisions a database is at in the project's chain (empty: none applied)."""
        context = MigrationContext.configure(connection, opts={"version_table": USER_VERSION_TABLE})
        return set(context.get_current_heads())

    def create(self) -> None:
        """Write the project (env.py, the revision template, versions/) if not there."""
        if self.exists:
            return
        (self.directory / "versions").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_SCRIPT_TEMPLATE, self.directory / "script.py.mako")
        (self.directory / "env.py").write_text(_ENV_PY.format(program=program()))

    def revision(self, message: str) -> Path:
        """Write an empty revision after the chain's head (making the project first if
        need be); returns its file. Needs no database."""
        self.create()
        script = command.revision(self.config(), message=message)
        assert script is not None and not isinstance(script, list)
        return Path(script.path)


def configured_migrations(settings: Settings, base: Path | None = None) -> UserMigrations | None:
    """The migrations `migrate` applies and start-up checks: ``settings.REGENT_MIGRATIONS``
    found as `user_migrations` finds it, required there when the user set it.

    Raises SettingsError when REGENT_MIGRATIONS was set (environment, ``.env`` or an
    override) and names no migrations: a path set by hand that holds nothing is a
    mistake, not "no migrations of your own". The default may be absent."""
    return user_migrations(
        settings.REGENT_MIGRATIONS,
        base,
        required="REGENT_MIGRATIONS" in settings.model_fields_set,
    )


def user_migrations(
    setting: str, base: Path | None = None, *, required: bool = False
) -> UserMigrations | None:
    """The project named by the ``REGENT_MIGRATIONS`` setting; None when it is empty.

    A relative path is taken from the project's root, found from ``base`` (default: the
    working directory) up, as git and pytest find theirs: the nearest directory that
    holds the migrations (their env.py) or a pyproject.toml; ``base`` itself when none
    does. So every command, and the app's start-up check, finds the same migrations
    from anywhere inside the project.

    Raises SettingsError naming the directory and the fix when ``required`` and no
    migrations (their env.py) are there."""
    if not setting.strip():
        return None
    directory = Path(setting).expanduser()
    start = (base or Path.cwd()).resolve()
    if not directory.is_absolute():
        directory = project_root(directory, start) / directory
    found = UserMigrations(directory)
    if required and not found.exists:
        raise SettingsError(
            f"REGENT_MIGRATIONS={setting!r}: no migrations in {found.directory} (no env.py; "
            f"looked from {start} up); run from inside your project, start them there with "
            f'`{program()} revision -m "..."`, or fix or unset REGENT_MIGRATIONS'
        )
    return found
