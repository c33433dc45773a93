"""The scheduler refuses a lock server a session lock cannot live on; the API serves."""

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.localpg import free_port
from app.main import create_app
from app.scheduler import Role, Scheduler, UnsafeLockConnectionError
from app.scheduler.election import check_pooling, check_primary
from app.settings import Settings
from app.testing import TestServer


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
    upstream = make_url(database_url)
    (tmp_path / "users.txt").write_text('"regent" ""\n')
    (tmp_path / "pgbouncer.ini").write_text(
        "[databases]\n"
        f"* = host=127.0.0.1 port={upstream.port}\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {tmp_path / 'users.txt'}\n"
        "pool_mode = transaction\nserver_round_robin = 1\ndefault_pool_size = 4\n"
        "ignore_startup_parameters = idle_session_timeout,idle_in_transaction_session_timeout\n"
    )
    as_user = "postgres" if os.geteuid() == 0 else None
    process = subprocess.Popen(
        [str(PGBOUNCER), str(tmp_path / "pgbouncer.ini")],
        user=as_user,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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
        yield url
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
