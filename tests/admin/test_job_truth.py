"""Operators see the truth: broken jobs in the job list, page and health; a leader that
does not fire is not healthy; "running" is the running lease; health allows each job the
age its own schedule implies."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import text

from app.admin.health import stale_jobs
from app.db import Database
from app.main import create_app
from app.scheduler import Interval, JobContext, Scheduler, cron, every
from app.settings import Settings

from ..conftest import SkewedClock, StartScheduler, admin_session
from .conftest import AUTH, TOKEN, Serve, beat_after_promotion, eventually_json, set_lease

UTC_ZONE = ZoneInfo("UTC")


class _PoisonedTrigger(Interval):
    """A trigger whose slot math always raises."""

    def next_after(self, moment: datetime, zone: ZoneInfo) -> datetime:
        raise ArithmeticError("this trigger cannot compute a slot")


async def _noop(ctx: JobContext) -> None:
    return None


def _hourly(*extra: tuple[str, Any]) -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(_noop)
    for job_id, trigger in extra:
        scheduler.job(trigger, id=job_id)(_noop)
    return scheduler


async def test_a_broken_job_is_listed_and_makes_health_not_ok(serve: Serve) -> None:
    scheduler = _hourly(("poisoned", _PoisonedTrigger(timedelta(hours=1))))
    async with serve(scheduler) as client:
        health = await eventually_json(
            client, "/health/scheduler", lambda body: body.get("broken_jobs")
        )
        assert health["status"] == "unhealthy" and health["broken_jobs"] == ["poisoned"]
        # The other job's row is registered after the poisoned one is marked broken.
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        jobs = {
            job["id"]: job for job in (await client.get("/admin/api/jobs", headers=AUTH)).json()
        }
        assert jobs["poisoned"]["broken"] is True
        assert "ArithmeticError" in jobs["poisoned"]["broken_error"]
        assert jobs["hourly"]["broken"] is False
        base = await admin_session(client, TOKEN)
        page = (await client.get(f"{base}/")).text
        poisoned_row = page[page.index('data-job="poisoned"') :].split("</tr>")[0]
        assert '<span class="broken"' in poisoned_row


async def test_a_broken_job_with_no_stored_row_is_offered_no_actions(serve: Serve) -> None:
    # Its first slot could not be computed, so it has no row: run now, pause and resume
    # would answer 404, and the page must not offer them.
    scheduler = _hourly(("poisoned", _PoisonedTrigger(timedelta(hours=1))))
    async with serve(scheduler) as client:
        await eventually_json(client, "/health/scheduler", lambda body: body.get("broken_jobs"))
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        jobs = {
            job["id"]: job for job in (await client.get("/admin/api/jobs", headers=AUTH)).json()
        }
        assert (jobs["poisoned"]["stored"], jobs["hourly"]["stored"]) == (False, True)
        base = await admin_session(client, TOKEN)
        page = (await client.get(f"{base}/")).text
    poisoned_row = page[page.index('data-job="poisoned"') :].split("</tr>")[0]
    hourly_row = page[page.index('data-job="hourly"') :].split("</tr>")[0]
    assert f"{base}/jobs/hourly/run" in hourly_row and f"{base}/jobs/hourly/pause" in hourly_row
    assert "<form" not in poisoned_row, poisoned_row
    assert f'href="{base}/jobs/poisoned"' not in poisoned_row, "its page would be a 404"


async def test_health_is_not_ok_while_the_leader_does_not_fire(serve: Serve) -> None:
    async with serve(_hourly(), HANDOVER_GRACE_SECONDS=3600) as client:
        response = await client.get("/health/scheduler")
    assert response.status_code == 503
    assert response.json()["leader"] is True and response.json()["firing"] is False


async def test_health_is_not_ok_once_the_job_timer_died(serve: Serve) -> None:
    scheduler = _hourly()
    async with serve(scheduler) as client:
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        await eventually_json(client, "/health/scheduler", lambda body: body["status"] == "ok")
        [timer] = [task for task in asyncio.all_tasks() if task.get_name() == "leader-jobs-timer"]
        timer.cancel()
        health = await eventually_json(
            client, "/health/scheduler", lambda body: body["status"] != "ok"
        )
    assert health["broken_jobs"] == ["hourly"]


async def test_run_now_is_a_409_while_the_running_lease_holds(
    serve: Serve, database: Database
) -> None:
    async with serve(_hourly()) as client:
        await eventually_json(client, "/admin/api/jobs", lambda jobs: jobs, headers=AUTH)
        await set_lease(database, "now() + interval '1 hour'")
        response = await client.post("/admin/api/jobs/hourly/run", headers=AUTH)
        [job] = (await client.get("/admin/api/jobs", headers=AUTH)).json()
    assert response.status_code == 409 and "running" in response.json()["detail"], response.text
    assert job["running"] is True


async def test_a_running_status_whose_lease_ran_out_does_not_block_run_now(
    serve: Serve, database: Database
) -> None:
    async with serve(_hourly()) as client:
        await eventually_json(client, "/admin/api/jobs", lambda jobs: jobs, headers=AUTH)
        await set_lease(database, "now() - interval '1 minute'")
        [job] = (await client.get("/admin/api/jobs", headers=AUTH)).json()
        response = await client.post("/admin/api/jobs/hourly/run", headers=AUTH)
    assert job["running"] is False and job["last_status"] == "abandoned"
    assert response.status_code == 202


# A reader whose clock runs ahead of the database's by more than a freshly renewed lease.
AHEAD_OF_THE_LEASE = SkewedClock(timedelta(seconds=11))
# A lease renewed just now (LEASE_SECONDS is 6 in the test settings), on the DB's clock.
FRESH_LEASE = "clock_timestamp() + interval '6 seconds'"


async def test_a_reader_whose_clock_runs_ahead_still_sees_a_live_run_running(
    serve: Serve, database: Database
) -> None:
    async with serve(_hourly(), clock=AHEAD_OF_THE_LEASE) as client:
        await eventually_json(client, "/admin/api/jobs", lambda jobs: jobs, headers=AUTH)
        await set_lease(database, FRESH_LEASE)
        [job] = (await client.get("/admin/api/jobs", headers=AUTH)).json()
    assert (job["running"], job["last_status"]) == (True, "running")


async def test_run_now_from_a_host_whose_clock_runs_ahead_is_a_409_while_the_lease_holds(
    serve: Serve, database: Database
) -> None:
    async with serve(_hourly(), clock=AHEAD_OF_THE_LEASE) as client:
        await eventually_json(client, "/admin/api/jobs", lambda jobs: jobs, headers=AUTH)
        await set_lease(database, FRESH_LEASE)
        response = await client.post("/admin/api/jobs/hourly/run", headers=AUTH)
    assert response.status_code == 409 and "running" in response.json()["detail"], response.text


async def test_the_page_offers_no_run_now_for_a_timed_out_thread_whose_body_still_runs(
    serve: Serve, database: Database
) -> None:
    async with serve(_hourly()) as client:
        await eventually_json(client, "/admin/api/jobs", lambda jobs: jobs, headers=AUTH)
        await set_lease(database, "now() + interval '1 hour'")
        async with database.engine.begin() as conn:
            # The outcome of a thread past its timeout: recorded, while its lease holds.
            await conn.execute(text("UPDATE scheduler_jobs SET last_status = 'timeout'"))
        base = await admin_session(client, TOKEN)
        page = (await client.get(f"{base}/")).text
        refused = await client.post("/admin/api/jobs/hourly/run", headers=AUTH)
    row = page[page.index('data-job="hourly"') :].split("</tr>")[0]
    run_now = row[: row.index(">Run now</button>")]
    assert refused.status_code == 409
    assert run_now.rstrip().endswith("disabled"), row


async def test_health_read_on_a_host_whose_clock_runs_ahead_sees_the_leader_firing(
    serve: Serve, database: Database
) -> None:
    async with serve(_hourly(), clock=AHEAD_OF_THE_LEASE) as client:
        await beat_after_promotion(database)
        health = (await client.get("/health/scheduler")).json()
    assert health["firing"] is True, health


async def test_health_sees_a_leader_whose_clock_runs_behind_firing(
    start_scheduler: StartScheduler, settings: Settings, database: Database
) -> None:
    supervisor = await start_scheduler(_hourly(), clock=SkewedClock(timedelta(minutes=-5)))
    await supervisor.wait_until_firing()
    await beat_after_promotion(database)
    app = create_app(settings, None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            health = (await client.get("/health/scheduler")).json()
    assert health["firing"] is True, health


FRIDAY_RUN = datetime(2026, 1, 2, 6, 0, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "stale"),
    [
        (datetime(2026, 1, 3, 12, tzinfo=UTC), False),  # Saturday
        (datetime(2026, 1, 4, 23, tzinfo=UTC), False),  # Sunday night
        (datetime(2026, 1, 5, 6, 30, tzinfo=UTC), False),  # Monday's run may still go on
        (datetime(2026, 1, 6, 7, tzinfo=UTC), True),  # Tuesday: Monday's slot had no success
    ],
)
def test_health_allows_a_weekday_cron_the_age_its_schedule_implies(
    now: datetime, stale: bool
) -> None:
    scheduler = Scheduler()
    scheduler.job(cron("0 6 * * 1-5", tz="UTC"), id="weekday")(_noop)
    row = {
        "id": "weekday",
        "paused": False,
        "last_success_at": FRIDAY_RUN,
        "created_at": FRIDAY_RUN - timedelta(days=30),
        "leader_only": True,
    }
    assert stale_jobs(scheduler, [row], now, UTC_ZONE) == (["weekday"] if stale else [])


def test_health_does_not_call_a_job_stale_before_its_first_slot() -> None:
    scheduler = Scheduler()
    scheduler.job(every(seconds=1), id="later", first_run=86400 * 365)(_noop)
    now = datetime(2026, 1, 2, tzinfo=UTC)
    row = {
        "id": "later",
        "paused": False,
        "next_run_at": now + timedelta(days=364),
        "last_success_at": None,
        "created_at": now - timedelta(days=1),
    }
    assert stale_jobs(scheduler, [row], now, UTC_ZONE) == []
