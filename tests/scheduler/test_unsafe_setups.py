"""The scheduler refuses a lock server a session lock cannot live on; the API serves."""

import asyncio
import os
import shutil
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import asyncpg_dsn
from app.localpg import free_port
from app.main import create_app
from app.scheduler import Role, Scheduler, ServiceContext, UnsafeLockConnectionError
from app.scheduler.keys import LEADER_KEY_LOCKS
from app.scheduler.lock_target import check_pooling, check_primary
from app.settings import Settings
from app.testing import TestServer

from .conftest import StartScheduler, eventually, holder_count


def test_a_backend_pid_that_changes_between_statements_is_a_pooling_proxy() -> None:
    with pytest.raises(UnsafeLockConnectionError, match=r"transaction-pooling proxy.*directly"):
        check_pooling(101, 202)
    check_pooling(101, 101)


def test_a_server_in_recovery_is_refused() -> None:
    with pytest.raises(UnsafeLockConnectionError, match=r"read-only replica.*primary"):
        check_primary(True)
    check_primary(False)


@pytest.mark.restarts_server
async def test_lock_url_on_a_replica_refuses_the_scheduler_and_the_api_serves(
    server: TestServer, settings: Settings, database_url: str
) -> None:
    replica = server.replica()
    try:
        database = make_url(database_url).database
        assert database is not None
        lock_url = replica.url_for(database)
        scheduler = Scheduler()
        app = create_app(settings.model_copy(update={"LOCK_DATABASE_URL": lock_url}), scheduler)
        async with app.router.lifespan_context(app):
            assert scheduler.supervisor is not None
            await scheduler.supervisor.wait_for_role(Role.STOPPED)
            assert "read-only replica" in (scheduler.supervisor.refusal or "")
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                assert (await client.get("/healthz")).status_code == 200
    finally:
        replica.stop()


PGBOUNCER = Path("/usr/sbin/pgbouncer")


@pytest.fixture
def pooler(server: TestServer, database_url: str) -> Iterator[str]:
    """pgbouncer in transaction mode in front of the test server, its pool warmed to
    several server connections and handing them out round robin; yields its URL."""
    if not PGBOUNCER.exists():
        pytest.skip("needs pgbouncer (.ci/run installs it)")
    # Not pytest's tmp_path: as root pgbouncer runs as postgres, who cannot enter it.
    tmp_path = Path(tempfile.mkdtemp(prefix="regent-pgbouncer-"))
    tmp_path.chmod(0o755)
    port = free_port()
    upstream = make_url(server.tcp_url_for(str(make_url(database_url).database)))
    # pgbouncer logs in to the server with the password it finds here.
    (tmp_path / "users.txt").write_text(f'"{upstream.username}" "{upstream.password}"\n')
    (tmp_path / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={upstream.port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = scram-sha-256\nauth_file = {tmp_path / 'users.txt'}\n"
        "pool_mode = transaction\nserver_round_robin = 1\ndefault_pool_size = 4\n"
        "ignore_startup_parameters = idle_session_timeout,idle_in_transaction_session_timeout,"
        "lock_timeout,statement_timeout\n"
    )
    as_user = "postgres" if os.geteuid() == 0 else None
    process = subprocess.Popen(
        [str(PGBOUNCER), str(tmp_path / "pgbouncer.ini")],
        user=as_user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # Asks for SCRAM as the server's URL does: the port is free_port()'s a moment before
    # pgbouncer binds it, and another user's process could take it meanwhile.
    url = upstream.set(port=port).render_as_string(hide_password=False)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                psycopg.connect(url, connect_timeout=1, autocommit=True).close()
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, "pgbouncer did not start"
                time.sleep(0.05)
        # Warm the pool: four transactions at once hold four server connections.
        clients = [psycopg.connect(url, autocommit=True) for _ in range(4)]
        threads = [
            threading.Thread(target=c.execute, args=("SELECT pg_sleep(0.3)",)) for c in clients
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for client in clients:
            client.close()
        # For asyncpg, which knows no require_auth; pgbouncer holds the port by now.
        yield make_url(url).difference_update_query(["require_auth"]).render_as_string(False)
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.restarts_server
async def test_lock_url_through_a_transaction_pooler_refuses_the_scheduler(
    pooler: str, settings: Settings
) -> None:
    scheduler = Scheduler()
    app = create_app(settings.model_copy(update={"LOCK_DATABASE_URL": pooler}), scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.STOPPED)
        assert "transaction-pooling proxy" in (scheduler.supervisor.refusal or "")
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            assert (await client.get("/healthz")).status_code == 200


def _database_of(url: str) -> str:
    database = make_url(url).database
    assert database is not None
    return database


def _with_service(started: list[str], worker: str) -> Scheduler:
    scheduler = Scheduler()

    @scheduler.service(id="long_poll")
    async def long_poll(ctx: ServiceContext) -> None:
        started.append(worker)
        await asyncio.Event().wait()

    return scheduler


_WAITING_SINCE_SQL = text(
    f"""
    SELECT coalesce(extract(epoch FROM clock_timestamp() - max(a.query_start)), 0)
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE {LEADER_KEY_LOCKS} AND NOT l.granted
    """
)


@pytest.mark.parametrize("setting", ["lock_timeout", "statement_timeout"])
async def test_a_database_timeout_does_not_cut_a_standbys_wait(
    setting: str, start_scheduler: StartScheduler, engine: AsyncEngine, database_url: str
) -> None:
    """A timeout set on the database (or role) would cancel pg_advisory_lock; the lock
    connection overrides it, so the standby keeps waiting and never fires unguarded."""
    async with engine.begin() as conn:
        await conn.execute(
            text(f"ALTER DATABASE \"{_database_of(database_url)}\" SET {setting} = '300ms'")
        )
    started: list[str] = []
    leading = await start_scheduler(_with_service(started, "leader"))
    await leading.wait_for_role(Role.LEADER)
    standby = await start_scheduler(_with_service(started, "standby"))
    await standby.wait_for_role(Role.STANDBY)

    async def waited_past_the_timeout() -> bool:
        assert standby.role is Role.STANDBY, f"the standby became {standby.role.value}"
        async with engine.connect() as conn:
            return float((await conn.execute(_WAITING_SINCE_SQL)).scalar_one()) > 1.5

    await eventually(waited_past_the_timeout, 15, f"a standby wait longer than {setting}")
    assert await holder_count(engine) == 1
    assert started == ["leader"]


async def test_a_lock_url_on_another_database_refuses_the_scheduler(
    start_scheduler: StartScheduler, database_url: str, empty_database_url: str
) -> None:
    """The slot claims' fence looks for the key in the app's database: a key held in
    another one would make a leader that never fires."""
    supervisor = await start_scheduler(Scheduler(), lock_dsn=asyncpg_dsn(empty_database_url))
    await supervisor.wait_for_role(Role.STOPPED)
    refusal = supervisor.refusal or ""
    assert "LOCK_DATABASE_URL" in refusal
    assert _database_of(empty_database_url) in refusal
    assert _database_of(database_url) in refusal


@pytest.fixture
def unprivileged_lock_url(pg_server: TestServer, database_url: str) -> Iterator[str]:
    """URL of ``database_url`` as a login role that may not call pg_control_system()."""
    role = f"regent_plain_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE \"{role}\" LOGIN PASSWORD '{role}'".encode())
    try:
        yield make_url(database_url).set(username=role, password=role).render_as_string(False)
    finally:
        with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP ROLE IF EXISTS "{role}"'.encode())


def _revoke_pg_control_system(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")


async def test_a_lock_role_without_pg_control_system_is_checked_all_the_same(
    start_scheduler: StartScheduler,
    pg_server: TestServer,
    database_url: str,
    empty_database_url: str,
    unprivileged_lock_url: str,
) -> None:
    for url in (database_url, empty_database_url):
        _revoke_pg_control_system(url)
    same = Scheduler()
    leading = await start_scheduler(same, lock_dsn=asyncpg_dsn(unprivileged_lock_url))
    await leading.wait_for_role(Role.LEADER)
    await same.stop()
    elsewhere = make_url(unprivileged_lock_url).set(database=_database_of(empty_database_url))
    refused = await start_scheduler(
        Scheduler(), lock_dsn=asyncpg_dsn(elsewhere.render_as_string(False))
    )
    await refused.wait_for_role(Role.STOPPED)
    assert _database_of(empty_database_url) in (refused.refusal or "")
