"""Sign-in that holds and cannot be turned against the admin: one throttle for the
page and both bearer APIs, counted atomically across workers, a form that needs its
CSRF value, and the right token never refused for what others sent."""

from __future__ import annotations

import asyncio
import re
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.admin.auth import admin_key
from app.admin.session import SIGN_IN_FORM_MAX_AGE, sign_in_form_value
from app.admin.throttle import FORGET_AFTER, FREE_FAILURES
from app.settings import Settings, SettingsError, load_settings

from ..conftest import admin_sign_in as sign_in
from ..conftest import sign_in_fields
from .conftest import ADMIN, ADMIN_TOKEN, API, Open, serve_python_m_app

WRONG = {"Authorization": "Bearer wrong-token-0123456789abcdef0123456789"}


async def test_wrong_bearer_tokens_on_the_admin_api_are_throttled(open_app: Open) -> None:
    async with open_app() as client:
        answers = [await client.get("/admin/api/jobs", headers=WRONG) for _ in range(25)]
    codes = [answer.status_code for answer in answers]
    assert codes[:FREE_FAILURES] == [401] * FREE_FAILURES
    assert set(codes[FREE_FAILURES:]) == {429}, codes
    assert int(answers[-1].headers["retry-after"]) >= 1


async def test_wrong_bearer_tokens_on_the_example_api_are_throttled(
    open_app: Open, workspace: int
) -> None:
    async with open_app() as client:
        codes = [
            (
                await client.get("/api/stats", params={"workspace_id": workspace}, headers=WRONG)
            ).status_code
            for _ in range(FREE_FAILURES + 3)
        ]
    assert codes == [401] * FREE_FAILURES + [429] * 3


async def test_wrong_tokens_from_a_client_named_by_a_long_forwarded_address_are_throttled(
    open_app: Open,
) -> None:
    # What a trusted proxy passes on from X-Forwarded-For: any text, of any length.
    # Random text does not compress below the index's row size limit as "9" * 6000 would.
    async with open_app(client_ip=secrets.token_urlsafe(4500)) as client:
        codes = [
            (await client.get("/admin/api/jobs", headers=WRONG)).status_code
            for _ in range(FREE_FAILURES + 1)
        ]
    assert codes == [401] * FREE_FAILURES + [429]


async def test_forgetting_old_counts_reads_only_the_old_ones(engine: AsyncEngine) -> None:
    # Every wrong token runs this DELETE; the table has a row per address ever counted.
    forget = (
        "DELETE FROM admin_login_failures WHERE last_failure_at"
        f" < now() - interval '{FORGET_AFTER.total_seconds()} seconds'"
    )
    async with engine.begin() as conn:
        await conn.execute(text("SET LOCAL enable_seqscan = off"))
        plan = (await conn.execute(text(f"EXPLAIN {forget}"))).scalars().all()
    assert "admin_login_failures_age" in "\n".join(plan), plan


async def test_the_page_and_both_apis_count_into_one_throttle(
    open_app: Open, workspace: int
) -> None:
    async with open_app() as client:
        await sign_in(client, "wrong-token-on-the-page-0123456789abcdef")
        await sign_in(client, "wrong-token-on-the-page-0123456789abcdef")
        await client.get("/admin/api/jobs", headers=WRONG)
        await client.get("/admin/api/jobs", headers=WRONG)
        await client.get("/api/stats", params={"workspace_id": workspace}, headers=WRONG)
        assert (await client.get("/admin/api/jobs", headers=WRONG)).status_code == 429


async def test_twenty_wrong_sign_ins_at_once_across_workers_are_counted_one_by_one(
    open_app: Open,
) -> None:
    async with open_app() as first, open_app() as second:
        clients = [first, second] * 10
        answers = await asyncio.gather(
            *(
                sign_in(client, f"guess-{n}-0123456789abcdef0123456789")
                for n, client in enumerate(clients)
            )
        )
    codes = sorted(answer.status_code for answer in answers)
    assert codes == [401] * FREE_FAILURES + [429] * (20 - FREE_FAILURES)


async def test_the_right_token_signs_in_after_others_sent_wrong_ones_from_its_address(
    open_app: Open,
) -> None:
    async with open_app("127.0.0.1") as other_user, open_app("127.0.0.1") as admin:
        for n in range(FREE_FAILURES + 3):
            await sign_in(other_user, f"guess-{n}-0123456789abcdef0123456789")
        for _ in range(FREE_FAILURES + 3):
            await other_user.get("/admin/api/jobs", headers=WRONG)
        page = await sign_in(admin, ADMIN_TOKEN)
        api = await admin.get("/admin/api/jobs", headers=ADMIN)
    assert page.status_code == 303, page.text
    assert api.status_code == 200, api.text


async def test_the_right_api_token_answers_after_wrong_ones_from_its_address(
    open_app: Open, workspace: int
) -> None:
    async with open_app() as client:
        for _ in range(FREE_FAILURES + 3):
            await client.get("/api/stats", params={"workspace_id": workspace}, headers=WRONG)
        grant = {"workspace_id": workspace, "amount": 5, "reference": "after-wrong-ones"}
        answer = await client.post("/api/credits/grants", json=grant, headers=API)
    assert answer.status_code == 202, answer.text


async def test_a_sign_in_without_the_forms_csrf_value_is_refused(open_app: Open) -> None:
    async with open_app() as client:
        answer = await client.post("/admin/login", data={"token": ADMIN_TOKEN})
    assert answer.status_code == 403, answer.text
    assert "regent_admin" not in answer.cookies


@pytest.mark.parametrize(
    "served_ago", [SIGN_IN_FORM_MAX_AGE + timedelta(minutes=1), -timedelta(minutes=5)]
)
async def test_a_sign_in_forms_value_past_its_age_or_from_the_future_is_refused(
    open_app: Open, security_settings: Settings, served_ago: timedelta
) -> None:
    key = admin_key(security_settings)
    assert key is not None
    stale = sign_in_form_value(key, datetime.now(UTC) - served_ago)
    async with open_app() as client:
        answer = await client.post("/admin/login", data={"token": ADMIN_TOKEN, "csrf": stale})
    assert answer.status_code == 403, answer.text


@pytest.mark.parametrize("fetched_from", ["cross-site", "same-site"])
async def test_a_sign_in_posted_from_another_sites_page_spends_no_wrong_token(
    open_app: Open, fetched_from: str
) -> None:
    # Anyone who can load the form holds a current value; another site's page (or
    # another port of this host: same-site) posts it from the admin's browser.
    async with open_app() as client:
        form = (await client.get("/admin")).text
        answers = [
            await client.post(
                "/admin/login",
                data=sign_in_fields(form, f"wrong-{n}-0123456789abcdef0123456789"),
                headers={"Sec-Fetch-Site": fetched_from},
            )
            for n in range(FREE_FAILURES + 1)
        ]
        typo = await client.post(
            "/admin/login", data=sign_in_fields(form, "typo-of-the-admin-0123456789abcdef0123")
        )
    assert {answer.status_code for answer in answers} == {403}
    assert typo.status_code == 401, typo.text


async def test_a_sign_in_value_no_text_can_hold_is_refused_not_a_500(open_app: Open) -> None:
    # A multipart body names its own charset, which Starlette honours: this one decodes
    # the field to a lone surrogate.
    body = (
        b'--b\r\nContent-Disposition: form-data; name="csrf"\r\n\r\n\\ud800.abc\r\n'
        b'--b\r\nContent-Disposition: form-data; name="token"\r\n\r\nwrong\r\n--b--\r\n'
    )
    headers = {"Content-Type": "multipart/form-data; boundary=b; charset=unicode_escape"}
    async with open_app() as client:
        answer = await client.post("/admin/login", content=body, headers=headers)
    assert answer.status_code == 403, answer.text[:200]


async def test_cross_site_sign_ins_with_wrong_tokens_count_for_nothing(open_app: Open) -> None:
    async with open_app() as client:
        # A form another site posts from the admin's browser has no CSRF value.
        for n in range(FREE_FAILURES + 3):
            await client.post("/admin/login", data={"token": f"guess-{n}-0123456789abcdef"})
        answer = await sign_in(client, "typo-of-the-admin-0123456789abcdef0123")
    assert answer.status_code == 401, answer.text


@pytest.mark.parametrize("name", ["ADMIN_TOKEN", "API_TOKEN"])
def test_a_token_shorter_than_32_characters_is_refused_with_the_command_that_makes_one(
    name: str,
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(_env_file=None, **{name: "x" * 31})
    assert name in str(refused.value)
    assert "at least 32" in str(refused.value)
    assert "openssl rand -hex 32" in str(refused.value)


@pytest.mark.parametrize("name", ["ADMIN_TOKEN", "API_TOKEN"])
def test_a_token_of_one_character_repeated_is_refused_with_the_command_that_makes_one(
    name: str,
) -> None:
    with pytest.raises(SettingsError) as refused:
        load_settings(_env_file=None, **{name: "a" * 40})
    assert name in str(refused.value)
    assert "openssl rand -hex 32" in str(refused.value)


def test_one_token_for_the_admin_and_the_api_is_refused() -> None:
    # The API's holder (a billing service) would hold the admin's rights too.
    token = "0123456789abcdef" * 3
    with pytest.raises(SettingsError) as refused:
        load_settings(_env_file=None, ADMIN_TOKEN=token, API_TOKEN=token)
    assert "ADMIN_TOKEN" in str(refused.value) and "API_TOKEN" in str(refused.value)
    assert token not in str(refused.value), "the token itself is never echoed"


def _forwarded_guesses(port: int) -> list[int]:
    """Wrong tokens from 127.0.0.1, each naming another address in X-Forwarded-For."""
    return [
        httpx.get(
            f"http://127.0.0.1:{port}/admin/api/jobs",
            headers=WRONG | {"X-Forwarded-For": f"198.51.100.{n}"},
        ).status_code
        for n in range(FREE_FAILURES + 2)
    ]


def test_python_m_app_believes_no_x_forwarded_for_by_default(
    database_url: str, tmp_path: Path
) -> None:
    for port in serve_python_m_app(database_url, tmp_path / "stderr.txt"):
        codes = _forwarded_guesses(port)
    assert codes == [401] * FREE_FAILURES + [429] * 2


def test_python_m_app_believes_x_forwarded_for_from_a_proxy_named_in_trusted_proxies(
    database_url: str, tmp_path: Path
) -> None:
    for port in serve_python_m_app(
        database_url, tmp_path / "stderr.txt", TRUSTED_PROXIES="127.0.0.1"
    ):
        codes = _forwarded_guesses(port)
    assert codes == [401] * (FREE_FAILURES + 2)


def test_every_uvicorn_command_the_readme_gives_believes_no_forwarded_header() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    commands = re.findall(r"`((?:[A-Z_]+=\S+ )*uvicorn [^`]*)`", readme)
    assert commands, "the README gives no uvicorn command"
    believing = [
        command
        for command in commands
        if "--no-proxy-headers" not in command and "--forwarded-allow-ips" not in command
    ]
    assert believing == [], f"uvicorn commands believing X-Forwarded-For: {believing}"
