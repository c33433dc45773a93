"""A user's own tables as alembic revisions of their own (way (a), this repository as the
backend): `python -m app revision` writes one after the head of the user's chain,
`python -m app migrate` applies Regent's migrations then the user's, each chain in its
own version table, and the app refuses to start while the user's are not applied."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from app.db import REGENT_VERSION_TABLE, SchemaNotAtHeadError, head_revision, migrate
from app.main import create_app
from app.settings import load_settings

from .test_app import _Lifespan

_CREATE_SIGNUPS = (
    "    op.create_table(\n"
    '        "signups", sa.Column("id", sa.Integer, primary_key=True), '
    'sa.Column("email", sa.Text, nullable=False)\n'
    "    )\n"
)


def _app(project: Path, *args: str, database_url: str | None = None) -> str:
    """Run `python -m app ARGS` in the user's project directory; returns its stderr."""
    env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    done = subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def _revision(path: Path) -> tuple[str, str | None]:
    """(revision, down_revision) of a revision file, read as alembic reads them."""
    values: dict[str, str | None] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            assert node.value is not None
            values[node.target.id] = ast.literal_eval(node.value)
    return values["revision"] or "", values["down_revision"]


def _revisions(project: Path) -> list[Path]:
    return sorted((project / "migrations" / "versions").glob("*.py"))


def _one(url: str, query: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
    return None if row is None else row[0]


def _add_signups(project: Path) -> str:
    """A first revision of the user's that creates their `signups` table; its id."""
    _app(project, "revision", "-m", "signups")
    (path,) = _revisions(project)
    source = path.read_text()
    path.write_text(
        source.replace(
            "def upgrade() -> None:\n    pass\n", "def upgrade() -> None:\n" + _CREATE_SIGNUPS, 1
        )
    )
    return _revision(path)[0]


def test_revision_starts_the_users_own_chain_and_adds_each_after_its_head(
    user_project: Path,
) -> None:
    _app(user_project, "revision", "-m", "signups")
    _app(user_project, "revision", "-m", "welcomed at")

    first, second = sorted(_revisions(user_project), key=lambda p: "welcomed" in p.name)
    assert _revision(first)[1] is None
    assert _revision(second)[1] == _revision(first)[0]


def test_migrate_applies_regents_migrations_then_the_users_each_in_its_own_version_table(
    user_project: Path, empty_database_url: str
) -> None:
    users_head = _add_signups(user_project)

    _app(user_project, "migrate", database_url=empty_database_url)

    assert _one(empty_database_url, f"SELECT version_num FROM {REGENT_VERSION_TABLE}") == (
        head_revision()
    )
    assert _one(empty_database_url, "SELECT version_num FROM alembic_version") == users_head
    assert _one(empty_database_url, "SELECT to_regclass('signups')::text") == "signups"


@pytest.fixture
def users_head_unapplied(user_project: Path, empty_database_url: str) -> str:
    """The user's `signups` revision written, Regent's migrations alone applied."""
    users_head = _add_signups(user_project)
    migrate(empty_database_url)
    return users_head


async def test_the_app_refuses_to_start_while_the_users_migrations_are_not_applied(
    user_project: Path,
    empty_database_url: str,
    users_head_unapplied: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(user_project)
    settings = load_settings(_env_file=None, DATABASE_URL=empty_database_url)

    with pytest.raises(SchemaNotAtHeadError) as refused:
        async with _Lifespan(create_app(settings)):
            pass

    message = str(refused.value)
    assert str(user_project / "migrations") in message
    assert users_head_unapplied in message
    assert "python -m app migrate" in message


def test_migrate_applies_a_project_that_alembic_init_made(
    user_project: Path, empty_database_url: str
) -> None:
    from alembic import command
    from alembic.config import Config

    # `alembic init migrations` and `alembic revision`: the user's env.py, not Regent's.
    config = Config(str(user_project / "alembic.ini"))
    command.init(config, str(user_project / "migrations"))
    config.set_main_option("script_location", str(user_project / "migrations"))
    users_head = command.revision(config, message="signups", rev_id="0001").revision  # type: ignore[union-attr]

    _app(user_project, "migrate", database_url=empty_database_url)

    assert _one(empty_database_url, "SELECT version_num FROM alembic_version") == users_head
