"""Every accepted message can be delivered: an outbox whose deliverer sends the key in
an HTTP header refuses at enqueue a key the header cannot carry, and the credit-grant
API answers 422 for such a reference and 409 for a reference reused with different
parameters."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import text

from app.db import Database
from app.outbox import HttpTransport, Outbox, UndeliverableKeyError

from .conftest import API, Open

UNSENDABLE = ["rechnung-müller-42", "grant\r\nX-Injected: 1", "bell\x07", " padded", "tab\t"]


def _http_outbox(database: Database) -> Outbox:
    client = httpx.AsyncClient(transport=httpx.MockTransport(lambda _: httpx.Response(200)))
    outbox = Outbox("grants", HttpTransport("http://receiver.test/grants", client=client))
    outbox.bind(database.engine, listen_dsn="")
    return outbox


async def _rows(database: Database) -> int:
    async with database.engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM outbox_messages"))).scalar_one())


@pytest.mark.parametrize("key", UNSENDABLE)
async def test_an_http_outbox_refuses_at_enqueue_a_key_its_header_cannot_carry(
    database: Database, key: str
) -> None:
    outbox = _http_outbox(database)
    with pytest.raises(UndeliverableKeyError) as refused:
        async with database.sessions() as session, session.begin():
            await outbox.enqueue(session, {"amount": 5}, key=key)
    assert refused.value.key == key
    assert "Idempotency-Key" in str(refused.value) and "ASCII" in str(refused.value)
    assert await _rows(database) == 0


async def test_an_http_outbox_delivers_a_key_of_visible_ascii_and_inner_spaces(
    database: Database,
) -> None:
    outbox = _http_outbox(database)
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, {"amount": 5}, key="invoice 42/2026-12:a~b")
    assert (await outbox.drain_once()).delivered == 1


@pytest.mark.parametrize("reference", UNSENDABLE)
async def test_the_grant_api_answers_422_for_a_reference_a_header_cannot_carry(
    open_app: Open, database: Database, workspace: int, reference: str
) -> None:
    grant = {"workspace_id": workspace, "amount": 5, "reference": reference}
    async with open_app() as client:
        answer = await client.post("/api/credits/grants", json=grant, headers=API)
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["detail"]
    assert error["loc"][-1] == "reference" and "ASCII" in error["msg"]
    assert await _rows(database) == 0


@pytest.mark.parametrize(
    "change", [{"amount": 6}, {"workspace_id": 2}], ids=["amount", "workspace"]
)
async def test_the_grant_api_answers_409_for_a_reference_reused_with_other_parameters(
    open_app: Open, database: Database, workspace: int, change: dict[str, int]
) -> None:
    async with database.engine.begin() as conn:
        await conn.execute(text("INSERT INTO workspaces (id, name) VALUES (2, 'Other')"))
    grant = {"workspace_id": workspace, "amount": 5, "reference": "grant-7"}
    async with open_app() as client:
        first = await client.post("/api/credits/grants", json=grant, headers=API)
        again = await client.post("/api/credits/grants", json=grant, headers=API)
        reused = await client.post("/api/credits/grants", json=grant | change, headers=API)
    assert (first.status_code, again.status_code) == (202, 200)
    assert again.json() == {"id": first.json()["id"], "created": False}
    assert reused.status_code == 409, reused.text
    assert "grant-7" in reused.json()["detail"]
