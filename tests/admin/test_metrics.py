"""GET /metrics: job, leader, outbox and loop series."""

import asyncio

import httpx
from sqlalchemy import text

from app.db import Database
from app.main import create_app
from app.scheduler import JobContext, Role, Scheduler, every
from app.settings import Settings


async def test_metrics_expose_job_leader_outbox_and_loop_series(
    settings: Settings, database: Database
) -> None:
    scheduler = Scheduler()
    fired = asyncio.Event()

    @scheduler.job(every(hours=1), id="metrics_probe")
    async def metrics_probe(ctx: JobContext) -> None:
        fired.set()

    async with database.engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO outbox_messages (outbox, key, payload, status, next_attempt_at,"
                " created_at, updated_at) VALUES ('mails', 'm1', '{}', 'pending', now(),"
                " now() - interval '90 seconds', now())"
            )
        )
    app = create_app(settings, scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        async with database.engine.begin() as conn:
            await conn.execute(text("UPDATE scheduler_jobs SET next_run_at = now()"))
            await conn.execute(text("NOTIFY regent_scheduler"))
        await asyncio.wait_for(fired.wait(), 10)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            async with asyncio.timeout(10):
                while 'job="metrics_probe",status="ok"' not in (
                    body := (await client.get("/metrics")).text
                ):
                    await asyncio.sleep(0.02)
        assert scheduler.supervisor.role is Role.LEADER
    assert 'regent_job_runs_total{job="metrics_probe",status="ok"} 1.0' in body
    assert 'regent_job_duration_seconds_count{job="metrics_probe"} 1.0' in body
    assert 'regent_job_lateness_seconds_count{job="metrics_probe"} 1.0' in body
    assert "regent_is_leader 1.0" in body
    assert "regent_leader_changes_total" in body
    assert "regent_event_loop_lag_seconds" in body
    assert 'regent_outbox_messages{outbox="mails",status="pending"} 1.0' in body
    oldest = next(
        line for line in body.splitlines() if line.startswith("regent_outbox_oldest_pending")
    )
    assert float(oldest.split()[-1]) >= 90
