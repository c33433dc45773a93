"""The database layer: schema-at-head check, unreachable servers, migrations under a lock."""

import os
import subprocess
import sys
import threading
import time

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db import (
    Database,
    DatabaseUnreachableError,
    SchemaNotAtHeadError,
    async_url,
    head_revision,
    migrate,
    verify_schema_at_head,
)
from app.localpg import free_port
from app.scheduler.keys import MIGRATION_LOCK_KEY


async def test_schema_at_head_passes(engine: AsyncEngine) -> None:
    await verify_schema_at_head(engine)


async def test_schema_behind_names_both_revisions_and_the_fix(empty_database_url: str) -> None:
    engine = create_async_engine(async_url(empty_database_url))
    try:
        with pytest.raises(SchemaNotAtHeadError) as raised:
            await verify_schema_at_head(engine)
    finally:
        await engine.dispose()
    assert raised.value.current is None
    assert raised.value.head == head_revision()
    assert "python -m app migrate" in str(raised.value)


async def test_unreachable_server_fails_fast_naming_host_and_port() -> None:
    port = free_port()
    engine = create_async_engine(async_url(f"postgresql://u:p@127.0.0.1:{port}/app"))
    started = time.monotonic()
    try:
        with pytest.raises(DatabaseUnreachableError) as raised:
            await verify_schema_at_head(engine, timeout=10)
    finally:
        await engine.dispose()
    assert time.monotonic() - started < 10
    assert f"127.0.0.1:{port}" in str(raised.value)
    assert "p@" not in str(raised.value)


def test_migrate_brings_an_empty_database_to_head(empty_database_url: str) -> None:
    migrate(empty_database_url)
    with psycopg.connect(empty_database_url) as conn:
        row = conn.execute("SELECT version_num FROM regent_alembic_version").fetchone()
    assert row == (head_revision(),)


def test_migrate_waits_for_the_migration_lock(empty_database_url: str) -> None:
    """A second migrate blocks on key 8110731 while another holds it, then succeeds."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate(empty_database_url)
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(empty_database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        worker = threading.Thread(target=run)
        worker.start()
        waiting = 0
        deadline = time.monotonic() + 20
        while waiting == 0 and time.monotonic() < deadline:
            (waiting,) = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s"
                " AND NOT granted AND database = (SELECT oid FROM pg_database"
                " WHERE datname = current_database())",
                (MIGRATION_LOCK_KEY,),
            ).fetchone() or (0,)
        assert waiting == 1, "migrate did not wait for the migration lock"
        assert worker.is_alive()
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    worker.join(30)
    assert not errors
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT version_num FROM regent_alembic_version").fetchone() == (
            head_revision(),
        )


def test_two_migrate_processes_at_once_both_succeed(empty_database_url: str) -> None:
    env = {**os.environ, "DATABASE_URL": empty_database_url}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "app", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    with psycopg.connect(empty_database_url) as conn:
        assert conn.execute("SELECT version_num FROM regent_alembic_version").fetchone() == (
            head_revision(),
        )


async def test_sessions_of_both_engines_reach_the_database(database_url: str) -> None:
    from app.db import Database

    db = Database.from_url(database_url)
    try:
        async with db.sessions() as session:
            assert (await session.execute(text("SELECT 1"))).scalar_one() == 1
        with db.sync_sessions() as sync_session:
            assert sync_session.execute(text("SELECT 2")).scalar_one() == 2
    finally:
        await db.dispose()


async def test_a_database_object_prints_no_password() -> None:
    database = Database.from_url("postgresql://app:db-pass-1@127.0.0.1:5432/app")
    try:
        assert "db-pass-1" not in repr(database) + str(database)
    finally:
        await database.dispose()
