"""Admin test helpers: the admin app of a worker whose scheduler a test started."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import httpx
import pytest
from pydantic import SecretStr

from app.main import create_app
from app.scheduler import Clock, Scheduler
from app.settings import Settings

__all__ = ["ADMIN_TOKEN", "WorkerAdmin"]

ADMIN_TOKEN = "worker-admin-token"

WorkerAdmin = Callable[[Scheduler, Clock], AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def worker_admin(settings: Settings) -> WorkerAdmin:
    """The admin app (API, page, /health/scheduler; token ADMIN_TOKEN) of the worker
    whose scheduler the test started on ``clock`` (start_scheduler): it reads that
    scheduler's jobs, and the lease clock as that worker does (a FakeClock's now), so
    a test moves what it reads with the clock it moves the scheduler with."""

    @asynccontextmanager
    async def admin(scheduler: Scheduler, clock: Clock) -> AsyncIterator[httpx.AsyncClient]:
        app = create_app(settings.model_copy(update={"ADMIN_TOKEN": SecretStr(ADMIN_TOKEN)}))
        async with app.router.lifespan_context(app):
            app.state.scheduler = scheduler
            app.state.clock = clock
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return admin
