"""A database a newer release of Regent migrated (its revision unknown to this code, as
after a rollback of the deploy) is refused in one line that says so and what to do:
deploy that release or a newer one. Never "run `python -m app migrate`", which cannot
help (this code does not know the revision) and then failed with alembic's traceback."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import SchemaNotAtHeadError, async_url, verify_schema_at_head

from .test_one_line_errors import _app, assert_one_line_error

NEWER = "9999"


@pytest.fixture
def newer_database_url(database_url: str) -> str:
    """A database at head, then marked as migrated by a newer release."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE regent_alembic_version SET version_num = %s", (NEWER,))
    return database_url


async def test_a_schema_of_a_newer_release_is_refused_naming_the_release_not_migrate(
    newer_database_url: str,
) -> None:
    engine = create_async_engine(async_url(newer_database_url))
    try:
        with pytest.raises(SchemaNotAtHeadError) as refused:
            await verify_schema_at_head(engine)
    finally:
        await engine.dispose()
    assert refused.value.current == NEWER
    assert "newer release" in str(refused.value)
    assert "python -m app migrate" not in str(refused.value)


def test_migrate_of_a_schema_of_a_newer_release_is_one_line(newer_database_url: str) -> None:
    assert_one_line_error(_app("migrate", DATABASE_URL=newer_database_url), NEWER, "newer release")
