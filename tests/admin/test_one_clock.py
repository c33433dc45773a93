"""Operators read and act on leases and due times on the database server's clock, never
on their own host's. The admin API and page of a worker whose clock runs two minutes
ahead of the database's, or two behind, and the CLI on such a machine: refuse to reset
a row a drain is delivering (further off than its 60 s lease) and make a reset row due
at once; read a job running while its lease holds and abandoned once it ran out; see a
firing leader firing; give the oldest pending row its true age."""

import argparse
import asyncio
import re
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from app.admin import Conflict
from app.admin.session import COOKIE
from app.admin.throttle import BASE_DELAY, FREE_FAILURES
from app.cli.commands import add_commands, run_command
from app.db import Database
from app.main import create_app
from app.scheduler import Clock, JobContext, Scheduler, SystemClock, every
from app.settings import Settings

from ..conftest import SkewedClock, StartScheduler, admin_sign_in
from .conftest import (
    AUTH,
    Serve,
    Worker,
    beat_after_promotion,
    eventually_json,
    page_csrf,
    set_lease,
    signed_in,
)

# A row as a drain's claim leaves it, on a host whose clock is the database's: held
# for the outbox's default lease (delivery_timeout 30 s and the drain's 30 s margin).
_BEING_DELIVERED = """
    INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,
        created_at, updated_at, claimed_by)
    VALUES ('grants', 'k1', '{}', 'pending', 0, clock_timestamp() + interval '60 seconds',
        now(), now(), gen_random_uuid())
    RETURNING id
    """
_STUCK = """
    INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,
        created_at, updated_at, last_error)
    VALUES ('grants', 'k1', '{}', 'stuck', 24, now(), now(), now(), 'HTTP 400')
    RETURNING id
    """
_PENDING_FOR_TEN_SECONDS = """
    INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,
        created_at, updated_at)
    VALUES ('grants', 'k1', '{}', 'pending', 0, now(),
        clock_timestamp() - interval '10 seconds', now())
    """
# Running leases as the database's clock reads them: one that holds (a minute is
# longer than any renewal gap), one that ran out a moment ago.
_LEASE_HOLDS = "clock_timestamp() + interval '1 minute'"
_LEASE_RAN_OUT = "clock_timestamp() - interval '1 second'"

_SURFACES = ["api", "page", "cli"]


async def _noop(ctx: JobContext) -> None:
    return None


def _hourly() -> Scheduler:
    scheduler = Scheduler()
    scheduler.job(every(hours=1), id="hourly")(_noop)
    return scheduler


async def _execute(database: Database, statement: str) -> Any:
    """Run ``statement`` in a transaction of its own; its first column's first value."""
    async with database.engine.begin() as conn:
        result = await conn.execute(text(statement))
        return result.scalar() if result.returns_rows else None


def _cli(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    return parser.parse_args(argv)


async def _reset(
    surface: str, client: httpx.AsyncClient, settings: Settings, clock: Clock, row: int
) -> int:
    """Reset row ``row`` of outbox grants as an operator does on ``surface``, where the
    API and page are served by ``client``'s app and the CLI runs on ``clock``; the HTTP
    status (the CLI's refusal, a Conflict, is a 409)."""
    if surface == "api":
        path = f"/admin/api/outboxes/grants/messages/{row}/reset"
        return (await client.post(path, headers=AUTH)).status_code
    if surface == "page":
        base, csrf = await signed_in(client)
        path = f"{base}/outboxes/grants/messages/{row}/reset"
        return (await client.post(path, data={"csrf": csrf})).status_code
    try:
        await run_command(settings, _cli("outbox", "reset", "grants", str(row)), clock=clock)
    except Conflict:
        return 409
    return 200


async def _job_runs_on_the_page(client: httpx.AsyncClient) -> bool:
    """Whether the admin page shows job ``hourly`` running: its Run now is disabled."""
    base, _ = await signed_in(client)
    page = (await client.get(f"{base}/")).text
    row = page[page.index('data-job="hourly"') :].split("</tr>")[0]
    return row[: row.index(">Run now</button>")].rstrip().endswith("disabled")


@pytest.mark.parametrize("surface", _SURFACES)
async def test_a_reset_from_a_host_two_minutes_off_answers_in_flight_for_a_row_being_delivered(
    serve: Serve,
    database: Database,
    settings: Settings,
    skewed_clock: SkewedClock,
    surface: str,
) -> None:
    row = await _execute(database, _BEING_DELIVERED)
    async with serve(_hourly(), clock=skewed_clock) as client:
        assert await _reset(surface, client, settings, skewed_clock, row) == 409


@pytest.mark.parametrize("surface", _SURFACES)
async def test_a_row_reset_from_a_host_two_minutes_off_is_due_at_once(
    serve: Serve,
    database: Database,
    settings: Settings,
    skewed_clock: SkewedClock,
    surface: str,
) -> None:
    row = await _execute(database, _STUCK)
    async with serve(_hourly(), clock=skewed_clock) as client:
        assert await _reset(surface, client, settings, skewed_clock, row) < 400
    due = (
        "SELECT next_attempt_at <= clock_timestamp() FROM outbox_messages WHERE status = 'pending'"
    )
    assert await _execute(database, due) is True


@pytest.mark.parametrize(("lease", "running"), [(_LEASE_HOLDS, True), (_LEASE_RAN_OUT, False)])
async def test_a_job_read_from_a_host_two_minutes_off_runs_exactly_while_its_lease_holds(
    serve: Serve, database: Database, skewed_clock: SkewedClock, lease: str, running: bool
) -> None:
    async with serve(_hourly(), clock=skewed_clock) as client:
        await eventually_json(client, "/admin/api/jobs", lambda jobs: jobs, headers=AUTH)
        await set_lease(database, lease)
        [job] = (await client.get("/admin/api/jobs", headers=AUTH)).json()
        on_the_page = await _job_runs_on_the_page(client)
    expected = "running" if running else "abandoned"
    assert (job["running"], job["last_status"], on_the_page) == (running, expected, running)


@pytest.mark.parametrize(("lease", "status"), [(_LEASE_HOLDS, 409), (_LEASE_RAN_OUT, 202)])
async def test_run_now_from_a_host_two_minutes_off_is_refused_exactly_while_the_lease_holds(
    serve: Serve, database: Database, skewed_clock: SkewedClock, lease: str, status: int
) -> None:
    async with serve(_hourly(), clock=skewed_clock) as client:
        await eventually_json(client, "/admin/api/jobs", lambda jobs: jobs, headers=AUTH)
        await set_lease(database, lease)
        response = await client.post("/admin/api/jobs/hourly/run", headers=AUTH)
    assert response.status_code == status, response.text


async def test_health_read_on_a_host_two_minutes_off_sees_the_leader_firing(
    serve: Serve, database: Database, skewed_clock: SkewedClock
) -> None:
    async with serve(_hourly(), clock=skewed_clock) as client:
        await beat_after_promotion(database)
        health = (await client.get("/health/scheduler")).json()
    assert health["firing"] is True, health


async def test_health_sees_a_leader_on_a_host_two_minutes_off_firing(
    start_scheduler: StartScheduler,
    settings: Settings,
    database: Database,
    skewed_clock: SkewedClock,
) -> None:
    supervisor = await start_scheduler(_hourly(), clock=skewed_clock)
    await supervisor.wait_until_firing()
    await beat_after_promotion(database)
    app = create_app(settings, None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            health = (await client.get("/health/scheduler")).json()
    assert health["firing"] is True, health


async def test_the_oldest_pending_row_read_from_a_host_two_minutes_off_has_its_true_age(
    serve: Serve, database: Database, skewed_clock: SkewedClock
) -> None:
    await _execute(database, _PENDING_FOR_TEN_SECONDS)
    async with serve(_hourly(), clock=skewed_clock) as client:
        [grants] = (await client.get("/admin/api/outboxes", headers=AUTH)).json()
    assert 10 <= grants["oldest_pending_seconds"] < 20, grants


async def test_a_session_begun_on_a_host_two_minutes_off_is_current_on_another_host(
    worker: Worker, skewed_clock: SkewedClock
) -> None:
    async with worker(clock=skewed_clock) as skewed, worker(clock=SystemClock()) as true_host:
        base, _ = await signed_in(skewed)
        true_host.cookies.set(COOKIE, skewed.cookies.get(COOKIE) or "", path=f"{base}/")
        page = (await true_host.get(f"{base}/")).text
    assert 'id="jobs"' in page


async def test_a_sign_out_on_a_host_two_minutes_off_ends_a_session_begun_before_elsewhere(
    worker: Worker, skewed_clock: SkewedClock
) -> None:
    async with worker(clock=skewed_clock) as skewed, worker(clock=SystemClock()) as true_host:
        base, _ = await signed_in(true_host)
        cookie = true_host.cookies.get(COOKIE) or ""
        skewed.cookies.set(COOKIE, cookie, path=f"{base}/")
        csrf = await page_csrf(skewed, base)
        await skewed.post(f"{base}/logout", data={"csrf": csrf})
        page = (await true_host.get(f"{base}/", follow_redirects=True)).text
    assert 'id="jobs"' not in page and 'name="token"' in page


async def test_a_client_slowed_on_a_host_two_minutes_off_waits_its_delay_on_another_host(
    worker: Worker, skewed_clock: SkewedClock
) -> None:
    async with worker(clock=skewed_clock) as skewed, worker(clock=SystemClock()) as true_host:
        # One wrong token past the free ones: the client must wait BASE_DELAY.
        for guess in range(FREE_FAILURES + 1):
            await admin_sign_in(skewed, f"guess-{guess}")
        answer = await admin_sign_in(true_host, "another-guess")
    assert answer.status_code == 429, answer.text
    assert 0 < int(answer.headers["retry-after"]) <= BASE_DELAY.total_seconds()


async def _manual_run_slot_age(database: Database) -> float:
    """Seconds from the slot of job hourly's manual run to the database's now, once the
    leader recorded the run."""
    async with asyncio.timeout(10):
        while True:
            age = await _execute(
                database,
                "SELECT extract(epoch FROM clock_timestamp() - slot) FROM scheduler_runs"
                " WHERE job_id = 'hourly' AND manual",
            )
            if age is not None:
                return float(age)
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("surface", _SURFACES)
async def test_a_run_now_from_a_host_two_minutes_off_is_asked_at_the_database_clock_now(
    serve: Serve,
    database: Database,
    settings: Settings,
    skewed_clock: SkewedClock,
    surface: str,
) -> None:
    scheduler = _hourly()
    async with serve(scheduler, clock=skewed_clock) as client:
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        if surface == "api":
            response = await client.post("/admin/api/jobs/hourly/run", headers=AUTH)
            assert response.status_code == 202
        elif surface == "page":
            base, csrf = await signed_in(client)
            response = await client.post(f"{base}/jobs/hourly/run", data={"csrf": csrf})
            assert response.status_code < 400
        else:
            await run_command(settings, _cli("jobs", "run", "hourly"), clock=skewed_clock)
        age = await _manual_run_slot_age(database)

    assert 0 <= age < 10


async def test_the_page_of_a_host_two_minutes_off_tells_how_far_off_a_slot_is_on_the_database_clock(
    serve: Serve, skewed_clock: SkewedClock
) -> None:
    scheduler = Scheduler()
    scheduler.job(every(minutes=10), id="often")(_noop)
    async with serve(scheduler, clock=skewed_clock) as client:
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        base, _ = await signed_in(client)
        page = (await client.get(f"{base}/")).text

    # The first slot is ten minutes after the row was made, a moment ago (a host two
    # minutes off would say 8 or 12).
    row = page[page.index('data-job="often"') :].split("</tr>")[0]
    assert re.search(r'<span class="rel">in (9|10) min</span>', row), row
