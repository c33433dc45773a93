"""The admin page: sign-in, cookie, CSRF, and an end-to-end run in headless chromium."""

import asyncio
import os
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.localpg import free_port
from app.main import create_app
from app.scheduler import JobContext, Scheduler, cron, every
from app.settings import Settings

from ..conftest import admin_session, admin_sign_in

TOKEN = "page-admin-token-0123456789abcdef"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def admin_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"ADMIN_TOKEN": SecretStr(TOKEN), "TIMEZONE": "Europe/Zurich"}
    )


@pytest.fixture
async def page_client(admin_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(admin_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def _signed_in(client: httpx.AsyncClient) -> tuple[str, str]:
    """Sign in; the base of the session's page and the CSRF field of the page."""
    base = await admin_session(client, TOKEN)
    page = await client.get(f"{base}/")
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match is not None, page.text
    return base, match.group(1)


def _table(html: str, table_id: str) -> str:
    match = re.search(rf'<table id="{table_id}"[^>]*>(.*?)</table>', html, re.DOTALL)
    assert match is not None, f"no table #{table_id}"
    return match.group(1)


async def _execute(database: Database, sql: str, **params: object) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(text(sql), params)


async def _job(database: Database, **columns: object) -> None:
    values = {"id": "nightly", "name": "Nightly sweep", "trigger": "every 900s"} | columns
    names = ", ".join(values)
    await _execute(
        database,
        f"INSERT INTO scheduler_jobs ({names}, next_run_at)"
        f" VALUES ({', '.join(':' + n for n in values)}, '2026-12-02 16:00:00+00')",
        **values,
    )


async def _run(database: Database, slot: datetime, **columns: object) -> None:
    values = {"status": "ok", "duration_ms": 5, "error": None, "manual": False} | columns
    await _execute(
        database,
        "INSERT INTO scheduler_runs (job_id, scope, slot, manual, started_at, finished_at,"
        " status, lateness_ms, duration_ms, pid, host, error) VALUES ('nightly', 'leader',"
        " :slot, :manual, :slot, :slot,"
        " :status, 3, :duration_ms, 4242, 'web-1', :error)",
        slot=slot,
        **values,
    )


async def test_the_job_page_lists_its_runs_newest_first_paged_by_before(
    page_client: httpx.AsyncClient, database: Database
) -> None:
    await _job(database)
    for hour in (1, 2, 3):
        await _run(database, datetime(2026, 12, 2, hour, tzinfo=UTC))
    base, _ = await _signed_in(page_client)
    first = await page_client.get(f"{base}/jobs/nightly?limit=2")
    assert first.status_code == 200
    history = _table(first.text, "history")
    assert history.index("2026-12-02 03:00:00Z") < history.index("2026-12-02 02:00:00Z")
    assert "01:00:00Z" not in history
    older = re.search(
        rf'href="({re.escape(base)}/jobs/nightly\?before=\d+&amp;limit=2)"', first.text
    )
    assert older is not None, "no link to older runs"
    rest = await page_client.get(older.group(1).replace("&amp;", "&"))
    assert "2026-12-02 01:00:00Z" in _table(rest.text, "history")
    assert 'id="older"' not in rest.text


async def test_a_failed_run_shows_its_error_with_the_traceback_folded(
    page_client: httpx.AsyncClient, database: Database
) -> None:
    stored = (
        'Traceback (most recent call last):\n  File "jobs.py", line 3, in sweep\n'
        "    charge()\nRuntimeError: gateway said no\n"
    )
    await _job(database)
    await _run(database, datetime(2026, 12, 2, 1, tzinfo=UTC), status="error", error=stored)
    base, _ = await _signed_in(page_client)
    history = _table((await page_client.get(f"{base}/jobs/nightly")).text, "history")
    folded = re.search(r"<details>\s*<summary>(.*?)</summary>(.*?)</details>", history, re.DOTALL)
    assert folded is not None, history
    assert folded.group(1).strip() == "RuntimeError: gateway said no"
    assert "File &#34;jobs.py&#34;, line 3" in folded.group(2)


async def test_history_marks_manual_runs(
    page_client: httpx.AsyncClient, database: Database
) -> None:
    await _job(database)
    await _run(database, datetime(2026, 12, 2, 1, tzinfo=UTC))
    await _run(database, datetime(2026, 12, 2, 1, 30, tzinfo=UTC), manual=True)
    base, _ = await _signed_in(page_client)
    history = _table((await page_client.get(f"{base}/jobs/nightly")).text, "history")
    rows = re.findall(r"<tr data-run=.*?</tr>", history, re.DOTALL)
    assert [("manual" in row) for row in rows] == [True, False]


async def test_the_page_of_an_unknown_job_is_a_404_naming_it(
    page_client: httpx.AsyncClient,
) -> None:
    base, _ = await _signed_in(page_client)
    response = await page_client.get(f"{base}/jobs/nope")
    assert response.status_code == 404
    assert "nope" in response.text


async def test_jobs_read_0_ms_seconds_timestamps_and_triggers_with_their_zone(
    page_client: httpx.AsyncClient, database: Database
) -> None:
    await _job(database, last_duration_ms=0, last_status="ok")
    await _job(database, id="digest", name="Digest", trigger="cron '0 6 * * *' default-zone")
    await _execute(
        database,
        "UPDATE scheduler_jobs SET last_finished_at = '2026-12-02 15:47:37.123456+00'",
    )
    base, _ = await _signed_in(page_client)
    jobs = _table((await page_client.get(f"{base}/")).text, "jobs")
    assert "0 ms" in jobs
    assert "2026-12-02 15:47:37Z" in jobs and ".123456" not in jobs and "+00:00" not in jobs
    assert "every 15 min" in jobs
    assert "cron 0 6 * * * (Europe/Zurich)" in jobs


async def test_pause_and_resume_from_the_page(
    page_client: httpx.AsyncClient, database: Database
) -> None:
    await _job(database)
    base, csrf = await _signed_in(page_client)
    paused = await page_client.post(f"{base}/jobs/nightly/pause", data={"csrf": csrf})
    assert paused.status_code == 303
    async with database.engine.connect() as conn:
        flag = text("SELECT paused FROM scheduler_jobs WHERE id = 'nightly'")
        assert (await conn.execute(flag)).scalar_one() is True
        page = await page_client.get(paused.headers["location"])
        assert "Job nightly is paused." in page.text
        assert f"{base}/jobs/nightly/resume" in _table(page.text, "jobs")
        await page_client.post(f"{base}/jobs/nightly/resume", data={"csrf": csrf})
        assert (await conn.execute(flag)).scalar_one() is False


async def test_the_page_refreshes_itself_without_repeating_the_flash(
    page_client: httpx.AsyncClient,
) -> None:
    base, _ = await _signed_in(page_client)
    page = (await page_client.get(f"{base}/?flash=run-nightly")).text
    refresh = rf'<meta http-equiv="refresh" content="\d+; url={re.escape(base)}/">'
    assert re.search(refresh, page)


async def test_empty_tables_say_none(page_client: httpx.AsyncClient, database: Database) -> None:
    await _job(database)
    base, _ = await _signed_in(page_client)
    page = (await page_client.get(f"{base}/")).text
    for table in ("outboxes", "pending", "stuck"):
        assert ">none<" in _table(page, table), table
    assert ">none<" in _table((await page_client.get(f"{base}/jobs/nightly")).text, "history")


async def test_pending_rows_are_listed_with_their_last_error(
    page_client: httpx.AsyncClient, database: Database
) -> None:
    await _execute(
        database,
        "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
        " created_at, updated_at, last_error) VALUES ('grants', 'grant-7', '{}', 'pending', 3,"
        " now(), now(), now(), 'HTTP 503 from the gateway')",
    )
    base, _ = await _signed_in(page_client)
    pending = _table((await page_client.get(f"{base}/")).text, "pending")
    assert "grant-7" in pending and "HTTP 503 from the gateway" in pending


async def test_root_leads_to_the_admin_page_when_a_token_is_set(
    page_client: httpx.AsyncClient,
) -> None:
    response = await page_client.get("/")
    assert response.status_code == 307
    assert response.headers["location"] == "/admin"


async def test_root_without_a_token_names_the_health_routes(settings: Settings) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/")
    assert response.status_code == 200
    body = response.json()
    assert {"/healthz", "/readyz", "/health/scheduler", "/metrics"} <= set(body["routes"])
    assert "ADMIN_TOKEN" in body["admin"]


async def test_page_is_404_without_a_configured_token(settings: Settings) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/admin")).status_code == 404


async def test_wrong_token_is_refused_and_sets_no_cookie(page_client: httpx.AsyncClient) -> None:
    response = await admin_sign_in(page_client, "guess")
    assert response.status_code == 401
    assert "set-cookie" not in response.headers


async def test_sign_in_sets_a_strict_http_only_cookie_without_the_token(
    page_client: httpx.AsyncClient,
) -> None:
    response = await admin_sign_in(page_client, TOKEN)
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert TOKEN not in cookie


async def test_a_post_without_the_csrf_field_is_refused(page_client: httpx.AsyncClient) -> None:
    base = await admin_session(page_client, TOKEN)
    response = await page_client.post(
        f"{base}/outboxes/grants/messages/1/reset", data={"csrf": "x"}
    )
    assert response.status_code == 403
    assert "CSRF" in response.text


async def test_reset_of_a_row_a_drain_holds_shows_why_on_the_page(
    page_client: httpx.AsyncClient, admin_settings: Settings, database: Database
) -> None:
    async with database.engine.begin() as conn:
        row = (
            await conn.execute(
                text(
                    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                    " next_attempt_at, created_at, updated_at, claimed_by) VALUES ('grants',"
                    " 'grant-12', '{}', 'pending', 0, now() + interval '1 hour', now(), now(),"
                    " gen_random_uuid()) RETURNING id"
                )
            )
        ).scalar_one()
    base = await admin_session(page_client, TOKEN)
    page = (await page_client.get(f"{base}/")).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None, page
    response = await page_client.post(
        f"{base}/outboxes/grants/messages/{row}/reset", data={"csrf": csrf.group(1)}
    )
    assert response.status_code == 409
    assert f"message {row} is being delivered" in response.text
    assert "wait for the drain" in response.text


async def test_the_api_ignores_the_page_cookie(page_client: httpx.AsyncClient) -> None:
    base = await admin_session(page_client, TOKEN)
    cookie = {"Cookie": f"regent_admin={page_client.cookies.get('regent_admin')}"}
    assert (await page_client.get(f"{base}/", headers=cookie)).status_code == 200
    assert (await page_client.get("/admin/api/jobs", headers=cookie)).status_code == 401


async def _page_width(page: Any) -> int:
    width: int = await page.evaluate("document.documentElement.scrollWidth")
    return width


async def _lines_per_trigger(page: Any) -> list[int]:
    """How many lines each trigger cell of the job list takes (one rect per line)."""
    lines: list[int] = await page.evaluate(
        """[...document.querySelectorAll("#jobs td.trigger")].map(cell => {
            const text = document.createRange();
            text.selectNodeContents(cell);
            return text.getClientRects().length;
        })"""
    )
    return lines


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (.ci/run installs it)")
async def test_sign_in_history_pause_resume_and_reset_in_chromium(
    admin_settings: Settings, database: Database, tmp_path: Path
) -> None:
    """The operator's round in a real browser; neither 1280 nor 400 px wide scrolls the
    page sideways. Screenshots go to REGENT_SCREENSHOTS (an existing directory) when set, to
    look at by hand, else to the test's temporary directory."""
    screenshots = Path(os.environ.get("REGENT_SCREENSHOTS") or tmp_path)
    from playwright.async_api import async_playwright

    scheduler = Scheduler()

    @scheduler.job(every(hours=6), id="nightly_digest", name="Nightly digest")
    async def nightly_digest(ctx: JobContext) -> None:
        return None

    @scheduler.job(cron("0 6 * * 1-5"), id="weekday_report", name="Weekday report")
    async def weekday_report(ctx: JobContext) -> None:
        raise RuntimeError("the report store answered 503")

    async with database.engine.begin() as conn:
        row = (
            await conn.execute(
                text(
                    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts,"
                    " next_attempt_at, created_at, updated_at, last_error) VALUES ('grants',"
                    " 'grant-9', '{}', 'stuck', 24, now(), now(), now(), 'HTTP 400')"
                    " RETURNING id"
                )
            )
        ).scalar_one()
    await _execute(
        database,
        "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
        " created_at, updated_at, last_error) VALUES ('grants', 'grant-10', '{}', 'pending', 2,"
        " now() + interval '30 seconds', now(), now(), 'HTTP 503 Service Unavailable')",
    )
    app = create_app(admin_settings, scheduler)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                await asyncio.sleep(0.02)
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                args=[
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                ],
                env={**os.environ, "HOME": os.environ.get("HOME", "/tmp")},
            )
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            await page.goto(f"http://127.0.0.1:{port}/")
            await page.fill("input[name=token]", TOKEN)
            await page.click("button[type=submit]")
            await page.wait_for_selector("#jobs")
            home = page.url  # the session's page: http://127.0.0.1:<port>/admin/s/<sid>/
            assert re.fullmatch(rf"http://127\.0\.0\.1:{port}/admin/s/[A-Za-z0-9_-]{{22}}/", home)
            assert "Nightly digest" in await page.inner_text("#jobs")
            assert "cron 0 6 * * 1-5 (Europe/Zurich)" in await page.inner_text("#jobs")

            # Run the failing job now and read its error on its page.
            report = page.locator("tr[data-job='weekday_report']")
            await report.get_by_role("button", name="Run now").click()
            await page.wait_for_selector("#flash")
            await page.click("a[href$='/jobs/weekday_report']")
            await page.wait_for_selector("#history")
            async with asyncio.timeout(20):
                while "the report store answered 503" not in await page.inner_text("#history"):
                    await page.click("#refresh")
                    await page.wait_for_selector("#history")
            run = page.locator("#history tr[data-run]").first
            assert "manual" in await run.inner_text()
            summary = run.locator("details summary")
            assert await summary.inner_text() == "RuntimeError: the report store answered 503"
            assert not await run.locator("details pre").is_visible()
            await summary.click()
            assert "Traceback" in await run.locator("details pre").inner_text()
            await page.screenshot(path=screenshots / "admin-job-1280.png", full_page=True)
            assert await _page_width(page) <= 1280

            # Pause and resume from the job's page.
            await page.get_by_role("button", name="Pause").click()
            await page.wait_for_selector("#flash")
            assert "Job weekday_report is paused." in await page.inner_text("#flash")
            assert "yes" in await page.inner_text("#job-state")
            await page.get_by_role("button", name="Resume").click()
            await page.wait_for_selector("text=Job weekday_report is resumed.")

            # Reset the stuck row from the main page; the pending one is listed too.
            await page.goto(home)
            assert "HTTP 503 Service Unavailable" in await page.inner_text("#pending")
            stuck_row = page.locator(f"tr[data-message='{row}']")
            assert "grant-9" in await stuck_row.inner_text()
            await page.screenshot(path=screenshots / "admin-1280.png", full_page=True)
            assert await _page_width(page) <= 1280
            assert set(await _lines_per_trigger(page)) == {1}
            await stuck_row.locator("button").click()
            await page.wait_for_selector("#flash")
            assert f"Message {row} is pending" in await page.inner_text("#flash")
            assert await page.locator(f"tr[data-message='{row}']").count() == 0
            pending = page.locator("tr[data-outbox='grants'] td.pending")
            assert await pending.inner_text() == "2"

            # A phone-sized window: nothing wider than the screen but the tables' scroll.
            await page.set_viewport_size({"width": 400, "height": 900})
            await page.goto(home)
            assert await _page_width(page) <= 400
            await page.screenshot(path=screenshots / "admin-400.png", full_page=True)
            await page.goto(f"{home}jobs/weekday_report")
            assert await _page_width(page) <= 400
            await page.screenshot(path=screenshots / "admin-job-400.png", full_page=True)
            await browser.close()
    finally:
        server.should_exit = True
        await serving
    async with database.engine.connect() as conn:
        status = await conn.execute(
            text("SELECT status, attempts FROM outbox_messages WHERE id = :id"), {"id": row}
        )
        assert tuple(status.one()) == ("pending", 0)
        paused = text("SELECT paused FROM scheduler_jobs WHERE id = 'weekday_report'")
        assert (await conn.execute(paused)).scalar_one() is False


async def test_an_empty_admin_token_opens_nothing_to_a_forged_cookie(settings: Settings) -> None:
    """With ADMIN_TOKEN='' the HMAC key was b'': anyone could compute the cookie."""
    import hashlib
    import hmac

    from app.admin.session import sid_for

    forged = hmac.new(b"", b"regent-admin-session", hashlib.sha256).hexdigest()
    app = create_app(settings.model_copy(update={"ADMIN_TOKEN": SecretStr("")}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            base = f"/admin/s/{sid_for(b'', forged)}"
            client.cookies.set("regent_admin", forged, path=f"{base}/")
            response = await client.get(f"{base}/")
    assert response.status_code == 404


async def test_a_refused_action_reads_as_an_error(
    page_client: httpx.AsyncClient, database: Database
) -> None:
    await _job(database, paused=True)
    base, csrf = await _signed_in(page_client)
    response = await page_client.post(f"{base}/jobs/nightly/run", data={"csrf": csrf})
    assert response.status_code == 409
    assert re.search(r'<p class="flash error" id="flash">[^<]*paused', response.text)
