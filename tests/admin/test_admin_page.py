"""The admin page: sign-in, cookie, CSRF, and an end-to-end run in headless chromium."""

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.localpg import free_port
from app.main import create_app
from app.scheduler import JobContext, Scheduler, every
from app.settings import Settings

TOKEN = "page-admin-token"
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture
def admin_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"ADMIN_TOKEN": SecretStr(TOKEN)})


@pytest.fixture
async def page_client(admin_settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(admin_settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client


async def test_page_is_404_without_a_configured_token(settings: Settings) -> None:
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            assert (await client.get("/admin")).status_code == 404


async def test_wrong_token_is_refused_and_sets_no_cookie(page_client: httpx.AsyncClient) -> None:
    response = await page_client.post("/admin/login", data={"token": "guess"})
    assert response.status_code == 401
    assert "set-cookie" not in response.headers


async def test_sign_in_sets_a_strict_http_only_cookie_without_the_token(
    page_client: httpx.AsyncClient,
) -> None:
    response = await page_client.post("/admin/login", data={"token": TOKEN})
    assert response.status_code == 303
    cookie = response.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert TOKEN not in cookie


async def test_a_post_without_the_csrf_field_is_refused(page_client: httpx.AsyncClient) -> None:
    await page_client.post("/admin/login", data={"token": TOKEN})
    response = await page_client.post("/admin/outboxes/grants/messages/1/reset", data={"csrf": "x"})
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
    await page_client.post("/admin/login", data={"token": TOKEN})
    page = (await page_client.get("/admin")).text
    csrf = re.search(r'name="csrf" value="([^"]+)"', page)
    assert csrf is not None, page
    response = await page_client.post(
        f"/admin/outboxes/grants/messages/{row}/reset", data={"csrf": csrf.group(1)}
    )
    assert response.status_code == 409
    assert f"message {row} is being delivered" in response.text
    assert "wait for the drain" in response.text


async def test_the_api_ignores_the_page_cookie(page_client: httpx.AsyncClient) -> None:
    await page_client.post("/admin/login", data={"token": TOKEN})
    assert (await page_client.get("/admin/api/jobs")).status_code == 401


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (.ci/run installs it)")
async def test_sign_in_see_jobs_reset_a_stuck_row_in_chromium(
    admin_settings: Settings, database: Database
) -> None:
    from playwright.async_api import async_playwright

    scheduler = Scheduler()

    @scheduler.job(every(hours=6), id="nightly_digest", name="Nightly digest")
    async def nightly_digest(ctx: JobContext) -> None:
        return None

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
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{port}/admin")
            await page.fill("input[name=token]", TOKEN)
            await page.click("button[type=submit]")
            await page.wait_for_selector("#jobs")
            assert "nightly_digest" in await page.inner_text("#jobs")
            assert "Nightly digest" in await page.inner_text("#jobs")
            stuck_row = page.locator(f"tr[data-message='{row}']")
            assert "grant-9" in await stuck_row.inner_text()
            await stuck_row.locator("button").click()
            await page.wait_for_selector("#flash")
            assert f"Message {row} is pending" in await page.inner_text("#flash")
            assert await page.locator(f"tr[data-message='{row}']").count() == 0
            pending = page.locator("tr[data-outbox='grants'] td.pending")
            assert await pending.inner_text() == "1"
            await browser.close()
    finally:
        server.should_exit = True
        await serving
    async with database.engine.connect() as conn:
        status = await conn.execute(
            text("SELECT status, attempts FROM outbox_messages WHERE id = :id"), {"id": row}
        )
        assert tuple(status.one()) == ("pending", 0)


async def test_an_empty_admin_token_opens_nothing_to_a_forged_cookie(settings: Settings) -> None:
    """With ADMIN_TOKEN='' the HMAC key was b'': anyone could compute the cookie."""
    import hashlib
    import hmac

    forged = hmac.new(b"", b"regent-admin-session", hashlib.sha256).hexdigest()
    app = create_app(settings.model_copy(update={"ADMIN_TOKEN": SecretStr("")}))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            client.cookies.set("regent_admin", forged, path="/admin")
            response = await client.get("/admin")
    assert response.status_code == 404
