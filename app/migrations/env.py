"""Alembic environment: async engine, and session advisory lock 8110731 held for the run.

Two `upgrade head` runs at once: the second waits on the lock, then finds the schema at
head and does nothing, so both succeed. Regent's revision is kept in its own table
(REGENT_VERSION_TABLE), never in the default alembic_version, which belongs to the
application's own migrations.
"""

import asyncio

from alembic import context
from sqlalchemy import Connection, pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import REGENT_VERSION_TABLE
from app.scheduler.keys import MIGRATION_LOCK_KEY

config = context.config

# A Regent from before its own version table kept its revision in alembic_version: the
# row is Regent's when it names one of Regent's revisions and Regent's tables exist.
_OLD_VERSION = text(
    "SELECT version_num FROM alembic_version"
    " WHERE to_regclass('scheduler_jobs') IS NOT NULL AND version_num = ANY(:ours)"
)


def _move_an_older_regents_version(connection: Connection) -> None:
    """Move Regent's revision out of alembic_version into its own table (dropping
    alembic_version when nothing else is left in it), so that a database made by an
    older Regent needs no step by hand. Runs under the migration lock."""
    exists = "SELECT to_regclass(:table) IS NOT NULL"
    if connection.scalar(text(exists), {"table": REGENT_VERSION_TABLE}):
        return
    if not connection.scalar(text(exists), {"table": "alembic_version"}):
        return
    ours = [script.revision for script in context.script.walk_revisions()]
    version = connection.scalar(_OLD_VERSION, {"ours": ours})
    if version is None:
        return
    connection.execute(
        text(f"CREATE TABLE {REGENT_VERSION_TABLE} (version_num varchar(32) NOT NULL PRIMARY KEY)")
    )
    connection.execute(
        text(f"INSERT INTO {REGENT_VERSION_TABLE} VALUES (:version)"), {"version": version}
    )
    connection.execute(
        text("DELETE FROM alembic_version WHERE version_num = :version"), {"version": version}
    )
    if not connection.scalar(text("SELECT EXISTS (SELECT 1 FROM alembic_version)")):
        connection.execute(text("DROP TABLE alembic_version"))


def _run_migrations(connection: Connection) -> None:
    _move_an_older_regents_version(connection)
    connection.commit()
    context.configure(
        connection=connection,
        transaction_per_migration=True,
        version_table=REGENT_VERSION_TABLE,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL: run migrations with `python -m app migrate`")
    engine = create_async_engine(url, poolclass=pool.NullPool)
    try:
        async with engine.connect() as connection:
            await connection.execute(
                text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
            await connection.commit()
            try:
                await connection.run_sync(_run_migrations)
                await connection.commit()
            finally:
                await connection.execute(
                    text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK_KEY}
                )
                await connection.commit()
    finally:
        await engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run against a database")
asyncio.run(_run_online())
