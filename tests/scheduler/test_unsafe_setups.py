"""The scheduler refuses a lock server a session lock cannot live on; the API serves."""

import httpx
import pytest
from sqlalchemy.engine import make_url

from app.main import create_app
from app.scheduler import Role, Scheduler, UnsafeLockConnectionError
from app.scheduler.election import check_pooling, check_primary
from app.settings import Settings

from ..pgserver import TestServer


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
