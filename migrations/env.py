"""Alembic environment: async engine, and session advisory lock 8110731 held for the run.

Two `upgrade head` runs at once: the second waits on the lock, then finds the schema at
head and does nothing, so both succeed.
"""

import asyncio

from alembic import context
from sqlalchemy import Connection, pool, text
from sqlalchemy.ext.asyncio import create_async_engine

from app.scheduler.keys import MIGRATION_LOCK_KEY

config = context.config


def _run_migrations(connection: Connection) -> None:
    context.configure(connection=connection, transaction_per_migration=True)
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
