"""Every accepted message can be delivered: HttpTransport sends a key an HTTP header
cannot carry as it is as an RFC 2047 encoded-word the receiver decodes (through any
wrapper a user puts around it), and the credit-grant
API answers 422 for such a reference and 409 for a reference reused with different
parameters."""

from __future__ import annotations

from email.header import decode_header

import httpx
import pytest
from sqlalchemy import text

from app.db import Database
from app.outbox import HttpTransport, Message, Outbox
from app.outbox.http import header_value

from .conftest import API, Open

UNSENDABLE = ["rechnung-müller-42", "grant\r\nX-Injected: 1", "bell\x07", " padded", "tab\t"]


async def _rows(database: Database) -> int:
    async with database.engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM outbox_messages"))).scalar_one())


def _receiver() -> tuple[httpx.AsyncClient, list[str]]:
    """A receiver (outside the system, faked) that keeps each Idempotency-Key it got."""
    received: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        received.append(request.headers.get("idempotency-key", ""))
        return httpx.Response(200)

    return httpx.AsyncClient(transport=httpx.MockTransport(answer)), received


def _decoded(header: str) -> str:
    """The receiver's reversal of the documented rule (app/outbox/http.py)."""
    parts = decode_header(header)
    if len(parts) == 1 and isinstance(parts[0][0], str):
        return parts[0][0]
    return b"".join(part if isinstance(part, bytes) else part.encode() for part, _ in parts).decode(
        "utf-8"
    )


@pytest.mark.parametrize(
    "key", [*UNSENDABLE, "=?UTF-8?B?YQ==?=", "x=?utf-8?q?a?=y", "\u202eevil", "esc\x1b[2J"]
)
async def test_a_wrapped_http_transport_delivers_any_key_by_a_reversible_header(
    database: Database, key: str
) -> None:
    client, received = _receiver()
    transport = HttpTransport("http://receiver.test/grants", client=client)

    async def deliver(message: Message) -> None:  # a user's own wrapper: log, then send
        await transport(message)

    outbox = Outbox("grants", deliver)
    outbox.bind(database.engine, listen_dsn="")
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, {"amount": 5}, key=key)
    assert (await outbox.drain_once()).delivered == 1
    [header] = received
    assert header.isascii() and header.isprintable(), header
    assert _decoded(header) == f"grants:{key}"


def test_distinct_keys_are_sent_as_distinct_headers() -> None:
    keys = [*UNSENDABLE, "plain", "=?UTF-8?B?YQ==?=", "a", "=?", "é", "e\u0301", " ", "  "]
    sent = [header_value(f"grants:{key}") for key in keys]
    assert len(set(sent)) == len(keys), sent


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
    "change",
    [{"amount": 6}, {"workspace_id": 2}, {"workspace_id": 999}],
    ids=["amount", "workspace", "unknown-workspace"],
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
