"""Regent's schema travels with the package and keeps to its own version table: a built
wheel migrates a database on its own, a user's alembic history on the same database is
never touched, and a database made by an older Regent moves over by itself."""

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.db import (
    REGENT_VERSION_TABLE,
    Database,
    DatabaseError,
    DatabaseUnreachableError,
    MigrationFailedError,
    SchemaNotAtHeadError,
    head_revision,
    migrate,
    verify_schema_at_head,
)

REPOSITORY = Path(__file__).resolve().parent.parent

# A user's own alembic project, as `alembic init` and one revision of theirs make it:
# the default version table (alembic_version), a revision id that Regent also uses.
_USER_ENV = """
    from alembic import context
    from sqlalchemy import create_engine

    engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
    with engine.connect() as connection:
        context.configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
"""
_USER_REVISION = """
    import sqlalchemy as sa
    from alembic import op

    revision = "0001"
    down_revision = None


    def upgrade() -> None:
        op.create_table("signups", sa.Column("id", sa.Integer, primary_key=True))
"""


# setuptools' own PEP 517 hook, as `python -m build --sdist` calls it (no download).
_BUILD_SDIST = (
    "import sys; from setuptools import build_meta; print(build_meta.build_sdist(sys.argv[1]))"
)


def _user_project(root: Path) -> Path:
    (root / "versions").mkdir(parents=True)
    (root / "env.py").write_text(textwrap.dedent(_USER_ENV))
    (root / "versions" / "0001_signups.py").write_text(textwrap.dedent(_USER_REVISION))
    return root


def _upgrade_user_project(project: Path, url: str) -> None:
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(project))
    # configparser reads % as interpolation; a socket URL has %2F in its host.
    psycopg_url = url.replace("postgresql://", "postgresql+psycopg://").replace("%", "%%")
    config.set_main_option("sqlalchemy.url", psycopg_url)
    command.upgrade(config, "head")


def _one(url: str, query: str) -> object:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
    return None if row is None else row[0]


def test_a_users_own_alembic_history_on_the_same_database_is_never_touched(
    empty_database_url: str, tmp_path: Path
) -> None:
    migrate(empty_database_url)
    _upgrade_user_project(_user_project(tmp_path / "migrations"), empty_database_url)
    migrate(empty_database_url)

    assert _one(empty_database_url, "SELECT version_num FROM alembic_version") == "0001"
    assert (
        _one(empty_database_url, f"SELECT version_num FROM {REGENT_VERSION_TABLE}")
        == head_revision()
    )


def test_a_database_made_by_an_older_regent_moves_to_its_own_version_table(
    empty_database_url: str,
) -> None:
    migrate(empty_database_url)
    # As a Regent that kept its revision in alembic_version left it.
    with psycopg.connect(empty_database_url) as conn:
        conn.execute(f"ALTER TABLE {REGENT_VERSION_TABLE} RENAME TO alembic_version")

    migrate(empty_database_url)

    assert (
        _one(empty_database_url, f"SELECT version_num FROM {REGENT_VERSION_TABLE}")
        == head_revision()
    )
    assert _one(empty_database_url, "SELECT to_regclass('alembic_version')") is None


def test_the_start_up_check_of_an_older_regents_database_says_so_and_to_migrate(
    empty_database_url: str,
) -> None:
    migrate(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute(f"ALTER TABLE {REGENT_VERSION_TABLE} RENAME TO alembic_version")

    async def start_up_check() -> None:
        database = Database.from_url(empty_database_url)
        try:
            await verify_schema_at_head(database.engine)
        finally:
            await database.dispose()

    with pytest.raises(SchemaNotAtHeadError) as refused:
        asyncio.run(start_up_check())

    message = str(refused.value)
    assert "an older Regent migrated" in message
    assert "migrate`" in message
    assert "<empty>" not in message


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Regent's wheel, built as a release is: the sdist from a copy of this checkout
    (the build leaves its work files beside the sources), then the wheel from the sdist,
    so that what either lacks the wheel lacks."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("dist")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPOSITORY / name, source / name)
    shutil.copytree(
        REPOSITORY / "app", source / "app", ignore=shutil.ignore_patterns("__pycache__")
    )
    sdist = subprocess.run(
        [sys.executable, "-c", _BUILD_SDIST, str(out)],
        cwd=source,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.splitlines()[-1]
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*build, "-w", str(out), str(out / sdist)], check=True)
    (wheel,) = out.glob("regent-*.whl")
    return wheel


def test_the_wheel_built_from_the_sdist_migrates_an_empty_database_on_its_own(
    built_wheel: Path, empty_database_url: str, tmp_path: Path
) -> None:
    installed = tmp_path / "site"
    # A pure-Python wheel unpacked is the package as pip installs it; the checkout is
    # not on the path (run from elsewhere, no PYTHONPATH to it).
    zipfile.ZipFile(built_wheel).extractall(installed)
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)} | {
        "PYTHONPATH": str(installed),
        "DATABASE_URL": empty_database_url,
    }
    done = subprocess.run(
        [sys.executable, "-P", "-m", "app", "migrate"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stderr
    assert (
        _one(empty_database_url, f"SELECT version_num FROM {REGENT_VERSION_TABLE}")
        == head_revision()
    )


def test_regents_tables_with_no_regent_revision_recorded_are_refused_saying_how_to_record_it(
    empty_database_url: str,
) -> None:
    migrate(empty_database_url)
    # As an older Regent left a database whose own revisions were added after Regent's
    # in the one chain: alembic_version names the user's revision, not Regent's.
    with psycopg.connect(empty_database_url) as conn:
        conn.execute(f"ALTER TABLE {REGENT_VERSION_TABLE} RENAME TO alembic_version")
        conn.execute("UPDATE alembic_version SET version_num = 'a1b2c3d4e5f6'")

    with pytest.raises(MigrationFailedError) as refused:
        migrate(empty_database_url)

    message = str(refused.value)
    assert "a1b2c3d4e5f6" in message
    assert REGENT_VERSION_TABLE in message
    assert "DATABASE_URL" not in message


@pytest.fixture
def url_of_a_role_that_may_not_create(empty_database_url: str) -> Iterator[str]:
    """``empty_database_url`` as a role that may connect but create nothing in it."""
    role = f"weak_{uuid.uuid4().hex[:8]}"
    url = make_url(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'weak'".encode())
        conn.execute(f'GRANT CONNECT ON DATABASE "{url.database}" TO {role}'.encode())
        conn.execute(b"REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    try:
        yield url.set(username=role, password="weak").render_as_string(hide_password=False)
    finally:
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {role}".encode())
            conn.execute(f"DROP ROLE {role}".encode())


def test_a_refusal_outside_any_revision_is_told_as_the_server_said_it(
    url_of_a_role_that_may_not_create: str,
) -> None:
    with pytest.raises(DatabaseError) as refused:
        migrate(url_of_a_role_that_may_not_create)

    assert "permission denied for schema public" in str(refused.value)


def test_a_role_that_may_not_connect_is_told_to_check_database_url(
    empty_database_url: str,
) -> None:
    role = f"outside_{uuid.uuid4().hex[:8]}"
    url = make_url(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'outside'".encode())
        conn.execute(f'REVOKE CONNECT ON DATABASE "{url.database}" FROM PUBLIC'.encode())
    try:
        with pytest.raises(DatabaseUnreachableError) as refused:
            migrate(url.set(username=role, password="outside").render_as_string(False))
    finally:
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}".encode())

    assert "permission denied for database" in str(refused.value)
    assert "DATABASE_URL" in str(refused.value)
