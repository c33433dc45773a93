"""The admin page and API send a Content-Security-Policy that allows no script and no
framing, nosniff and no-referrer; the page needs nothing inline; /docs (whose Swagger UI
comes from a CDN) is off by default."""

from __future__ import annotations

import re

import httpx

from ..conftest import admin_session, admin_sign_in
from .conftest import ADMIN, ADMIN_TOKEN, Open


def _assert_guarded(answer: httpx.Response) -> None:
    where = f"{answer.request.method} {answer.request.url.path} {answer.status_code}"
    policy = answer.headers.get("content-security-policy", "")
    directives = {
        name: value.strip()
        for name, _, value in (part.strip().partition(" ") for part in policy.split(";"))
    }
    assert directives.get("default-src") == "'none'", (where, policy)
    assert "frame-ancestors 'none'" in policy, (where, policy)
    assert "script-src" not in policy and "unsafe-inline" not in policy, (where, policy)
    assert answer.headers.get("x-content-type-options") == "nosniff", where
    assert answer.headers.get("referrer-policy") == "no-referrer", where


async def test_every_admin_answer_carries_the_security_headers(open_app: Open) -> None:
    async with open_app() as client:
        answers = [
            await client.get("/admin"),
            await client.get("/admin/api/jobs"),
            await client.get("/admin/api/jobs", headers=ADMIN),
            await client.get("/admin/no-such-page"),
            await admin_sign_in(client, "wrong-token-0123456789abcdef0123456789"),
            signed_in := await admin_sign_in(client, ADMIN_TOKEN),
            await client.get(signed_in.headers["location"]),
            await client.get(f"{signed_in.headers['location']}jobs/report_warm"),
            await client.get(f"{signed_in.headers['location']}no-such-page"),
            await client.get("/admin/s/not-a-session/"),
        ]
    for answer in answers:
        _assert_guarded(answer)


async def test_an_admin_answer_that_fails_still_carries_the_security_headers(
    open_app: Open,
) -> None:
    async with open_app(failing_route="/admin/api/fails") as client:
        answer = await client.get("/admin/api/fails", headers=ADMIN)
    assert answer.status_code == 500
    _assert_guarded(answer)


async def test_the_admin_page_behind_a_root_path_carries_the_security_headers(
    open_app: Open,
) -> None:
    async with open_app(root_path="/regent") as client:
        answer = await client.get("/regent/admin")
    assert answer.status_code == 200 and 'name="token"' in answer.text
    _assert_guarded(answer)


async def test_every_other_answer_is_neither_sniffed_framed_nor_referred(
    open_app: Open,
) -> None:
    async with open_app(failing_route="/api/fails") as client:
        answers = [
            await client.get(path)
            for path in (
                "/healthz",
                "/readyz",
                "/health/scheduler",
                "/metrics",
                "/openapi.json",
                "/no-such-path",
                "/api/stats",
                "/api/fails",
            )
        ]
    for answer in answers:
        where = f"{answer.request.url.path} {answer.status_code}"
        assert answer.headers.get("x-content-type-options") == "nosniff", where
        assert answer.headers.get("referrer-policy") == "no-referrer", where
        policy = answer.headers.get("content-security-policy", "")
        assert "frame-ancestors 'none'" in policy, where


async def test_the_admin_page_needs_no_inline_style_or_script(open_app: Open) -> None:
    async with open_app() as client:
        form = (await client.get("/admin")).text
        base = await admin_session(client, ADMIN_TOKEN)
        page = (await client.get(f"{base}/")).text
        stylesheets = re.findall(r'<link rel="stylesheet" href="([^"]+)">', page)
        assert stylesheets, page
        css = await client.get(stylesheets[0])
    for html in (form, page):
        assert "<script" not in html and "<style" not in html and " style=" not in html
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert "font:" in css.text


async def test_docs_are_off_by_default(open_app: Open) -> None:
    async with open_app() as client:
        answers = [await client.get(path) for path in ("/docs", "/redoc")]
    assert [answer.status_code for answer in answers] == [404, 404]
