"""Claims prepared ahead, on by default (cold review of the change that turned them on):
the app built from Settings, where the default matters."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from pydantic import SecretStr
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.main import create_app
from app.scheduler import JobContext, Role, Scheduler, every
from app.settings import Settings

from ..conftest import StartScheduler
from ..scheduler.conftest import eventually, lease_elsewhere, prepared_claim_waits, runs

TOKEN = "s3cret-admin-token-for-review"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(params=["lock_timeout", "statement_timeout"])
async def admin_on_a_database_with_a_timeout(
    request: pytest.FixtureRequest, settings: Settings, engine: AsyncEngine, database_url: str
) -> AsyncIterator[httpx.AsyncClient]:
    """The app from Settings (claims prepared ahead by the default lead), on a database
    whose lock_timeout or statement_timeout (200 ms, a common DBA setting, shorter than
    the lead) every app connection inherits, with a job due every two seconds."""
    name = make_url(database_url).database
    async with engine.begin() as conn:
        await conn.execute(text(f"ALTER DATABASE \"{name}\" SET {request.param} = '200ms'"))
    scheduler = Scheduler()

    @scheduler.job(every(seconds=2), id="often")
    async def often(ctx: JobContext) -> None:
        return None

    app: FastAPI = create_app(
        settings.model_copy(update={"ADMIN_TOKEN": SecretStr(TOKEN)}), scheduler
    )
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.LEADER)
        await scheduler.supervisor.wait_until_firing()
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


@pytest.mark.parametrize("action", ["pause", "run"])
async def test_an_admin_write_during_a_prepared_claim_never_answers_5xx(
    admin_on_a_database_with_a_timeout: httpx.AsyncClient, engine: AsyncEngine, action: str
) -> None:
    client = admin_on_a_database_with_a_timeout
    await eventually(lambda: prepared_claim_waits(engine), 10, "a claim prepared ahead")
    response = await client.post(f"/admin/api/jobs/often/{action}", headers=AUTH)
    assert response.status_code < 500, (
        f"{action} during a prepared claim answered {response.status_code}: {response.text}"
    )


async def test_a_run_elsewhere_that_ends_before_the_slot_does_not_skip_the_slot(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    """On the real clock: a run of the job in another process (an old leader's thread
    body that outlived its leadership) holds a live running lease, which the leader has
    read (with a change of the row's next slot). That run ends, and its outcome write
    releases the lease, within the claim lead before the slot. Nothing runs at the
    slot, so the slot must run, as it does with claim_ahead_seconds=0, not be recorded
    skipped_overlap by a claim prepared while the lease held."""
    scheduler = Scheduler()

    @scheduler.job(every(seconds=3600), id="hourly")
    async def hourly(ctx: JobContext) -> None:
        return None

    supervisor = await start_scheduler(scheduler)
    await supervisor.wait_until_firing()
    await lease_elsewhere(
        engine,
        "hourly",
        "now() + interval '1 hour'",
        "last_status = 'running'",
        "next_run_at = clock_timestamp() + interval '3 seconds'",
    )

    async def slot_within_the_lead() -> bool:
        async with engine.connect() as conn:
            left = await conn.execute(
                text(
                    "SELECT next_run_at - clock_timestamp() < interval '0.3 seconds'"
                    " FROM scheduler_jobs WHERE id = 'hourly'"
                )
            )
            return bool(left.scalar_one())

    await eventually(slot_within_the_lead, what="the slot within the claim lead")
    # The other process's outcome write, as its release of the lease (before the slot).
    async with engine.begin() as conn:
        released = await conn.execute(
            text(
                "UPDATE scheduler_jobs SET running_run_id = NULL, running_pid = NULL,"
                " running_host = NULL, running_since = NULL, running_until = NULL,"
                " last_status = 'ok' WHERE id = 'hourly' AND running_run_id = 999999"
            )
        )
        assert released.rowcount == 1

    async def recorded() -> bool:
        statuses = [status for status, _ in await runs(engine, "hourly")]
        return bool(statuses) and "running" not in statuses

    await eventually(recorded, what="the slot's run")
    statuses = [status for status, _ in await runs(engine, "hourly")]
    assert statuses == ["ok"], (
        f"a run that ended before the slot left it {statuses}: overlap judged when the "
        "claim was prepared"
    )
