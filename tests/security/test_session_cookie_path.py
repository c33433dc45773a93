"""The admin's session cookie is sent, and honoured, only under its session's secret
path ``/admin/s/<sid>/`` (sid: an HMAC of the cookie keyed by the admin token).

Browsers send a host's cookies to every port of that host: a cookie with Path=/admin
would reach another local user's server on 127.0.0.1:<other port>/admin/... . Scoped to
a path only this server can compute, another server receives it only if it already knows
the sid, and the cookie opens nothing at any other path."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import logging.config
import os
import re
import threading
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import httpx
import pytest
import uvicorn

from app.localpg import free_port
from app.logging import configure_logging
from app.main import create_app
from app.settings import Settings

from ..conftest import admin_sign_in, sign_in_fields
from .conftest import ADMIN_TOKEN, Open

if TYPE_CHECKING:
    from playwright.async_api import Page

SESSION_PATH = re.compile(r"/admin/s/[A-Za-z0-9_-]{22}/")


def _session_cookie(answer: httpx.Response) -> tuple[str, str]:
    """The value and Path of the session cookie an answer sets."""
    for header in answer.headers.get_list("set-cookie"):
        parsed: SimpleCookie = SimpleCookie()
        parsed.load(header)
        if "regent_admin" in parsed:
            return parsed["regent_admin"].value, parsed["regent_admin"]["path"]
    raise AssertionError(f"no session cookie set: {answer.headers}")


def _signed_in(answer: httpx.Response) -> bool:
    """A signed-in screen: it has the sign-out button."""
    return "Sign out</button>" in answer.text


async def test_the_session_cookie_is_sent_only_under_the_sessions_secret_path(
    open_app: Open,
) -> None:
    async with open_app() as client:
        answer = await admin_sign_in(client, ADMIN_TOKEN)
        assert answer.status_code == 303
        base = answer.headers["location"]
        assert SESSION_PATH.fullmatch(base), base
        value, path = _session_cookie(answer)
        assert path == base, "the browser must send the cookie under the session's path only"
        client.cookies.clear()
        cookie = {"Cookie": f"regent_admin={value}"}
        assert _signed_in(await client.get(base, headers=cookie))
        assert _signed_in(await client.get(f"{base}jobs/report_warm", headers=cookie))
        # What another server could be sent the cookie at: any other path.
        elsewhere = [
            await client.get(other, headers=cookie)
            for other in ("/admin", "/admin/", "/admin/jobs/report_warm", "/admin/s/")
        ]
    for other in elsewhere:
        assert not _signed_in(other), other.request.url


async def test_a_wrong_session_path_is_signed_out(open_app: Open) -> None:
    async with open_app() as client:
        answer = await admin_sign_in(client, ADMIN_TOKEN)
        base = answer.headers["location"]
        value, _ = _session_cookie(answer)
        page = (await client.get(base)).text
        csrf = re.search(r'name="csrf" value="([^"]+)"', page)
        assert csrf is not None, page
        client.cookies.clear()
        cookie = {"Cookie": f"regent_admin={value}"}
        sid = base.removeprefix("/admin/s/").removesuffix("/")
        wrong = sid[:-1] + ("A" if sid[-1] != "A" else "B")
        for bad in (f"/admin/s/{wrong}/", f"/admin/s/{sid[:-1]}/", f"/admin/s/{sid}x/"):
            shown = await client.get(bad, headers=cookie)
            assert shown.status_code == 303 and shown.headers["location"] == "/admin", bad
            acted = await client.post(
                f"{bad}jobs/report_warm/pause", data={"csrf": csrf.group(1)}, headers=cookie
            )
            assert acted.status_code == 401, (bad, acted.status_code)
            signed_out = await client.post(
                f"{bad}logout", data={"csrf": csrf.group(1)}, headers=cookie
            )
            assert signed_out.status_code == 303
        # The right path without the cookie is signed out the same way.
        bare = await client.get(base)
        assert bare.status_code == 303 and bare.headers["location"] == "/admin"
        # None of it paused the job nor ended the session.
        still = await client.get(base, headers=cookie)
    assert _signed_in(still) and 'name="token"' not in still.text
    assert "Job report_warm is paused" not in still.text


async def test_behind_a_root_path_the_session_path_starts_with_it(open_app: Open) -> None:
    async with open_app(root_path="/regent") as client:
        form = await client.get("/regent/admin")
        assert 'action="/regent/admin/login"' in form.text
        answer = await admin_sign_in(client, ADMIN_TOKEN, root_path="/regent")
        base = answer.headers["location"]
        assert base.startswith("/regent/admin/s/") and SESSION_PATH.fullmatch(
            base.removeprefix("/regent")
        ), base
        _, path = _session_cookie(answer)
        page = await client.get(base)
    assert path == base
    assert _signed_in(page)
    links = re.findall(r'(?:href|action)="([^"]+)"', page.text)
    assert links and all(link.startswith("/regent/admin/") for link in links), links
    assert all(link.startswith(base) for link in links if not link.endswith("admin.css")), links


def test_the_log_shows_a_sessions_path_without_its_sid(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # As `python -m app` and plain uvicorn configure uvicorn's loggers.
    logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)
    configure_logging("INFO")
    sid = "AbCdEfGhIjKlMnOpQrSt_-"
    path = f"/regent/admin/s/{sid}/jobs/nightly?flash=run-nightly"
    access = ("127.0.0.1:50000", "GET", path, "1.1", 200)
    logging.getLogger("uvicorn.access").info('%s - "%s %s HTTP/%s" %d', *access)
    written = capsys.readouterr()
    shown = written.out + written.err
    assert "/regent/admin/s/***/jobs/nightly?flash=run-nightly" in shown, shown
    assert sid not in shown


CHROMIUM = Path("/usr/bin/chromium")


class _OtherUsersServer(http.server.BaseHTTPRequestHandler):
    """Another local user's web server: notes the cookies it is sent, leads the
    browser on to a path under /admin of its own port, and at /toss sets a sign-in
    cookie of its own for the whole host."""

    seen: ClassVar[list[tuple[str, str]]] = []

    def do_GET(self) -> None:
        _OtherUsersServer.seen.append((self.path, self.headers.get("Cookie") or ""))
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        if self.path == "/toss":
            # For the whole host: the browser sends it to every port's /admin too.
            self.send_header("Set-Cookie", "regent_login=tossed; Path=/")
        self.end_headers()
        if self.path == "/":
            self.wfile.write(b'<a id="on" href="/admin/s/">on</a>')
        else:
            self.wfile.write(b"<p id='done'>done</p>")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.asynccontextmanager
async def _chromium_beside_another_server(settings: Settings) -> AsyncIterator[tuple[Page, int]]:
    """A Chromium page, the app served on one port of 127.0.0.1 and another user's
    server (_OtherUsersServer) on another; yields the page and the other port."""
    from playwright.async_api import async_playwright

    app = create_app(settings)
    port, other_port = free_port(), free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = asyncio.create_task(server.serve())
    other = http.server.HTTPServer(("127.0.0.1", other_port), _OtherUsersServer)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    _OtherUsersServer.seen.clear()
    try:
        async with asyncio.timeout(20):
            while not server.started:
                await asyncio.sleep(0.02)
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM),
                args=["--no-sandbox", "--disable-gpu", "--no-first-run"],
                env={**os.environ, "HOME": os.environ.get("HOME", "/tmp")},
            )
            page = await browser.new_page()
            await page.goto(f"http://127.0.0.1:{port}/admin")
            yield page, other_port
            await browser.close()
    finally:
        other.shutdown()
        other.server_close()
        server.should_exit = True
        await serving


async def _sign_in(page: Page) -> None:
    await page.fill("input[name=token]", ADMIN_TOKEN)
    await page.click("button[type=submit]")
    await page.wait_for_selector("#jobs", timeout=10_000)


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium")
async def test_another_port_of_the_host_is_never_sent_the_session_cookie(
    security_settings: Settings,
) -> None:
    async with _chromium_beside_another_server(security_settings) as (page, other_port):
        await _sign_in(page)
        cookies = await page.context.cookies()
        await page.goto(f"http://127.0.0.1:{other_port}/")
        await page.click("#on")
        await page.wait_for_selector("#done")
    assert any(cookie["name"] == "regent_admin" for cookie in cookies), cookies
    assert "/admin/s/" in [path for path, _ in _OtherUsersServer.seen]
    assert not [seen for seen in _OtherUsersServer.seen if "regent_admin=" in seen[1]]


@pytest.mark.parametrize(
    "tossed",
    [
        "regent_login=tossed",
        # Shaped like a value the form might make, and changed while the admin types.
        f"regent_login={'a' * 43}; regent_admin={'b' * 43}",
    ],
)
async def test_a_cookie_another_server_of_the_host_sets_does_not_lock_the_admin_out_of_sign_in(
    open_app: Open, tossed: str
) -> None:
    async with open_app() as client:
        form = await client.get("/admin", headers={"Cookie": "regent_login=" + "c" * 43})
        signed = await client.post(
            "/admin/login",
            data=sign_in_fields(form.text, ADMIN_TOKEN),
            headers={"Cookie": tossed},
        )
    assert signed.status_code == 303, signed.text[-300:]


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs chromium")
async def test_in_a_browser_a_sign_in_cookie_another_port_sets_does_not_lock_the_admin_out(
    security_settings: Settings,
) -> None:
    async with _chromium_beside_another_server(security_settings) as (page, other_port):
        admin = page.url
        await page.goto(f"http://127.0.0.1:{other_port}/toss")
        await page.wait_for_selector("#done")
        await page.goto(admin)
        await _sign_in(page)
