"""How an alembic environment of Regent's runs: one place for the migration lock.

Both chains run through ``run_online``: Regent's own (``app/migrations/env.py``, version
table ``regent_alembic_version``) and the user's own project that `python -m app
revision` writes (its ``env.py`` calls ``run_users_migrations``, version table
``alembic_version``). Each run holds session advisory lock 8110731 on its connection,
so two `migrate` runs at once take turns: the second finds the schema at head and does
nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from alembic import context
from sqlalchemy import Connection, MetaData, pool, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine

from .invocation import program
from .scheduler.keys import MIGRATION_LOCK_KEY

__all__ = ["USER_VERSION_TABLE", "NotConnectedError", "run_online", "run_users_migrations"]

USER_VERSION_TABLE = "alembic_version"
"""The user's chain keeps alembic's default version table, as any alembic project does."""


class NotConnectedError(Exception):
    """The migration's connection was refused or never made; ``args[0]`` is why (an
    authentication, a missing CONNECT privilege, an unreachable server): a problem of
    the URL or role, told apart from a statement a revision ran."""


def run_online(
    *,
    version_table: str,
    target_metadata: MetaData | None = None,
    before: Callable[[Connection], None] | None = None,
) -> None:
    """Run the current alembic command's migrations against ``sqlalchemy.url`` under
    the migration lock, one transaction per revision; ``before`` runs first, under the
    lock, in its own transaction. Refuses offline (--sql) mode."""
    if context.is_offline_mode():
        raise RuntimeError("offline (--sql) migrations are not supported; run against a database")
    url = context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError(f"no database URL: run migrations with `{program()} migrate`")

    def migrate(connection: Connection) -> None:
        if before is not None:
            before(connection)
            connection.commit()
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            transaction_per_migration=True,
            version_table=version_table,
        )
        with context.begin_transaction():
            context.run_migrations()

    async def run() -> None:
        engine = create_async_engine(url, poolclass=pool.NullPool)
        try:
            try:
                connection = await engine.connect().start()
            except Exception as exc:
                raise NotConnectedError(exc) from exc
            try:
                await locked(connection)
            finally:
                await connection.close()
        finally:
            await engine.dispose()

    async def locked(connection: AsyncConnection) -> None:
        lock = {"key": MIGRATION_LOCK_KEY}
        unlock = text("SELECT pg_advisory_unlock(:key)")
        await connection.execute(text("SELECT pg_advisory_lock(:key)"), lock)
        await connection.commit()
        try:
            await connection.run_sync(migrate)
            await connection.commit()
        except BaseException:
            # The failed statement left its transaction aborted: a statement there
            # would raise in place of the first error, which says what to fix. The
            # lock ends with the session anyway.
            with contextlib.suppress(Exception):
                await connection.rollback()
                await connection.execute(unlock, lock)
                await connection.commit()
            raise
        await connection.execute(unlock, lock)
        await connection.commit()

    asyncio.run(run())


def run_users_migrations(target_metadata: MetaData | None = None) -> None:
    """The body of the env.py of a user's own migrations: run them under the migration
    lock, their revision kept in ``alembic_version``. ``target_metadata`` is for
    ``alembic revision --autogenerate``."""
    run_online(version_table=USER_VERSION_TABLE, target_metadata=target_metadata)
