"""A database a newer release of the application migrated (its own chain at a revision
this code does not have: a deploy rolled back) is told as such, in one line naming the
revision, by `migrate` and by the start-up check, which do not send the user to run
`migrate` (which cannot help)."""

import asyncio
from pathlib import Path

import psycopg
import pytest

from app.db import (
    Database,
    MigrationFailedError,
    SchemaNotAtHeadError,
    migrate,
    verify_schema_at_head,
)
from app.user_migrations import UserMigrations

_NEWER = "f00dfacecafe"


@pytest.fixture
def migrated_by_a_newer_release(user_project: Path, empty_database_url: str) -> UserMigrations:
    """The user's one revision applied, then the database moved on by a newer release."""
    users = UserMigrations(user_project / "migrations")
    users.revision("first")
    migrate(empty_database_url, users)
    with psycopg.connect(empty_database_url) as conn:
        conn.execute(f"UPDATE alembic_version SET version_num = '{_NEWER}'".encode())
    return users


def test_migrate_names_the_revision_a_newer_release_left(
    migrated_by_a_newer_release: UserMigrations, empty_database_url: str
) -> None:
    with pytest.raises(MigrationFailedError) as refused:
        migrate(empty_database_url, migrated_by_a_newer_release)

    assert _NEWER in str(refused.value)
    assert str(migrated_by_a_newer_release.directory) in str(refused.value)


def test_the_start_up_check_says_a_newer_release_migrated_it_not_to_migrate(
    migrated_by_a_newer_release: UserMigrations, empty_database_url: str
) -> None:
    async def start_up_check() -> None:
        database = Database.from_url(empty_database_url)
        try:
            await verify_schema_at_head(database.engine, users=migrated_by_a_newer_release)
        finally:
            await database.dispose()

    with pytest.raises(SchemaNotAtHeadError) as refused:
        asyncio.run(start_up_check())

    message = str(refused.value)
    assert _NEWER in message
    assert "newer release" in message
    assert "migrate`" not in message
