"""Admin page sessions: no-store on every admin answer, sign-out revokes the cookie in
every worker, and repeated sign-in failures from one client are slowed."""

from __future__ import annotations

import re

from ..conftest import admin_session, admin_sign_in
from .conftest import AUTH, TOKEN, Worker


def _csrf(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


async def test_every_admin_answer_says_no_store(worker: Worker) -> None:
    async with worker() as client:
        answers = [
            await client.get("/admin"),
            await admin_sign_in(client, "wrong"),
            await client.get("/admin/api/jobs"),
            await client.get("/admin/api/jobs", headers=AUTH),
            await client.get("/admin/api/jobs/nope/runs", headers=AUTH),
            await client.get("/admin/api/jobs/bad%20id/runs", headers=AUTH),
            signed_in := await admin_sign_in(client, TOKEN),
            await client.get(signed_in.headers["location"]),
            await client.get(f"{signed_in.headers['location']}no-such-page"),
            await client.get("/admin/no-such-page"),
        ]
    for answer in answers:
        assert answer.headers.get("cache-control") == "no-store", answer.request.url


async def test_a_cookie_kept_past_sign_out_opens_nothing(worker: Worker) -> None:
    async with worker() as client:
        base = await admin_session(client, TOKEN)
        kept = client.cookies.get("regent_admin")
        page = await client.get(f"{base}/")
        csrf = _csrf(page.text)
        assert 'id="jobs"' in page.text
        signed_out = await client.post(f"{base}/logout", data={"csrf": csrf})
        assert signed_out.status_code == 303
        assert "regent_admin" not in client.cookies, "sign-out clears the cookie at its path"
        client.cookies.set("regent_admin", kept or "", path=f"{base}/")
        replayed = await client.get(f"{base}/", follow_redirects=True)
        action = await client.post(f"{base}/jobs/anything/run", data={"csrf": csrf})
    assert 'id="jobs"' not in replayed.text
    assert 'name="token"' in replayed.text
    assert action.status_code == 401


async def test_sign_out_in_one_worker_revokes_the_session_in_another(worker: Worker) -> None:
    async with worker() as first, worker() as second:
        base = await admin_session(first, TOKEN)
        cookie = first.cookies.get("regent_admin") or ""
        second.cookies.set("regent_admin", cookie, path=f"{base}/")
        assert 'id="jobs"' in (await second.get(f"{base}/")).text
        csrf = _csrf((await first.get(f"{base}/")).text)
        await first.post(f"{base}/logout", data={"csrf": csrf})
        assert 'id="jobs"' not in (await second.get(f"{base}/")).text


async def test_signing_in_again_after_sign_out_works(worker: Worker) -> None:
    async with worker() as client:
        base = await admin_session(client, TOKEN)
        csrf = _csrf((await client.get(f"{base}/")).text)
        await client.post(f"{base}/logout", data={"csrf": csrf})
        again = await admin_sign_in(client, TOKEN)
        assert again.status_code == 303 and again.headers["location"] != f"{base}/"
        assert 'id="jobs"' in (await client.get(again.headers["location"])).text


async def test_repeated_sign_in_failures_from_one_client_are_slowed(worker: Worker) -> None:
    async with worker("198.51.100.9") as attacker, worker("192.0.2.44") as operator:
        answers = [(await admin_sign_in(attacker, f"guess-{n}")) for n in range(8)]
        elsewhere = await admin_sign_in(operator, "a-typo")
    assert [answer.status_code for answer in answers] == [401] * 5 + [429] * 3
    assert int(answers[-1].headers["retry-after"]) >= 1
    assert elsewhere.status_code == 401
