"""The Python API refuses a bad value at the call, with Regent's own error naming the
argument and its limit, and writes nothing: no driver error from inside the caller's
transaction, no RecursionError, no AttributeError at registration."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import text

from app.db import Database, asyncpg_dsn
from app.outbox import (
    MAX_KEY_BYTES,
    MAX_NAME_LENGTH,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    Message,
    Outbox,
    OutboxArgumentError,
    PayloadError,
)
from app.scheduler import SchedulerError, cron, every
from app.scheduler.errors import TriggerArgumentError


async def _deliver(message: Message) -> None:
    """A receiver that is never called: nothing here is delivered."""


def _cycle() -> dict[str, Any]:
    payload: dict[str, Any] = {"a": [1]}
    payload["a"].append(payload)
    return payload


def _nested(depth: int) -> list[Any]:
    payload: list[Any] = []
    for _ in range(depth - 1):
        payload = [payload]
    return payload


@pytest.fixture
def outbox(database: Database, database_url: str) -> Iterator[Outbox]:
    outbox = Outbox("refusals", _deliver)
    outbox.bind(database.engine, listen_dsn=asyncpg_dsn(database_url))
    yield outbox


async def _rows(database: Database) -> int:
    async with database.engine.connect() as conn:
        return int((await conn.execute(text("SELECT count(*) FROM outbox_messages"))).scalar_one())


_BAD_ENQUEUES: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "nul-in-key": ({"key": "a\x00b"}, OutboxArgumentError, "NUL"),
    "surrogate-in-key": ({"key": "a\ud800b"}, OutboxArgumentError, "surrogate"),
    "key-past-the-index": (
        {"key": "k" * (MAX_KEY_BYTES + 1)},
        OutboxArgumentError,
        f"at most {MAX_KEY_BYTES} bytes",
    ),
    "key-not-text": ({"key": 5}, OutboxArgumentError, "non-empty str"),
    "nul-in-payload": ({"payload": {"note": "a\x00b"}}, PayloadError, "payload['note']"),
    "surrogate-in-payload": ({"payload": ["\udc80"]}, PayloadError, "payload[0]"),
    "surrogate-in-payload-key": ({"payload": {"\ud800": 1}}, PayloadError, "payload key"),
    "payload-contains-itself": ({"payload": _cycle()}, PayloadError, "contains itself"),
    "payload-100000-deep": (
        {"payload": _nested(100_000)},
        PayloadError,
        f"more than {MAX_PAYLOAD_DEPTH}",
    ),
    "payload-nan": ({"payload": {"x": float("nan")}}, PayloadError, "payload['x']"),
    "payload-int-past-the-digit-limit": (
        {"payload": {"n": 10**5000}},
        PayloadError,
        "payload['n'] is an int of more than",
    ),
    "payload-key-int-past-the-digit-limit": (
        {"payload": {10**5000: 1}},
        PayloadError,
        "payload key <an int of more than",
    ),
    # jsonb keeps one of two keys JSON writes alike: the other would be lost silently.
    "payload-keys-one-in-json": (
        {"payload": {"at": [{1: "first", "1": "second"}]}},
        PayloadError,
        "payload['at'][0] keys 1 and '1' are both \"1\"",
    ),
    "payload-past-the-size-limit": (
        {"payload": {"blob": "x" * MAX_PAYLOAD_BYTES}},
        PayloadError,
        "past MAX_PAYLOAD_BYTES",
    ),
}


@pytest.mark.parametrize(
    ("call", "error", "names"), list(_BAD_ENQUEUES.values()), ids=list(_BAD_ENQUEUES)
)
async def test_enqueue_refuses_a_value_postgresql_cannot_store_and_writes_nothing(
    database: Database,
    outbox: Outbox,
    call: dict[str, Any],
    error: type[Exception],
    names: str,
) -> None:
    arguments = {"payload": {"n": 1}, "key": "k"} | call
    async with database.sessions() as session, session.begin():
        with pytest.raises(error) as refused:
            await outbox.enqueue(session, arguments["payload"], key=arguments["key"])
    assert names in str(refused.value)
    if isinstance(refused.value, OutboxArgumentError):
        assert refused.value.argument == "key"
    assert await _rows(database) == 0


async def test_a_key_and_payload_at_their_limits_are_stored(
    database: Database, outbox: Outbox
) -> None:
    # Incompressible, so the index row is as long as the key: the limit is within it.
    key = secrets.token_hex(MAX_KEY_BYTES)[:MAX_KEY_BYTES]
    long_name = Outbox("n" * MAX_NAME_LENGTH, _deliver)
    long_name.bind(database.engine, listen_dsn="unused")
    async with database.sessions() as session, session.begin():
        await long_name.enqueue(session, _nested(MAX_PAYLOAD_DEPTH), key=key)
    assert await _rows(database) == 1


async def test_a_payload_of_max_payload_bytes_is_stored_whole(
    database: Database, outbox: Outbox
) -> None:
    blob = "é" * ((MAX_PAYLOAD_BYTES - len('{"blob": ""}')) // 2)  # two bytes each
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, {"blob": blob}, key="k")
    async with database.engine.connect() as conn:
        stored = await conn.execute(text("SELECT payload->>'blob' FROM outbox_messages"))
        assert stored.scalar_one() == blob


async def test_sync_enqueue_refuses_as_enqueue_does(database: Database, outbox: Outbox) -> None:
    with (
        database.sync_sessions() as session,
        session.begin(),
        pytest.raises(OutboxArgumentError, match="NUL"),
    ):
        outbox.enqueue_sync(session, {}, key="a\x00b")
    assert await _rows(database) == 0


def _sync_deliver(message: object) -> None:
    return None


_BAD_OUTBOXES: dict[str, tuple[dict[str, Any], str]] = {
    "non-ascii-name": ({"name": "café"}, "name"),
    "arabic-digits-name": ({"name": "٣"}, "name"),
    "name-with-a-space": ({"name": "my outbox"}, "name"),
    "name-too-long": ({"name": "n" * (MAX_NAME_LENGTH + 1)}, "name"),
    "name-not-text": ({"name": 5}, "name"),
    "deliver-none": ({"deliver": None}, "deliver"),
    # A plain function sends, then its result cannot be awaited: each retry sends again.
    "deliver-not-async": ({"deliver": _sync_deliver}, "deliver"),
    "deliver-a-class": ({"deliver": Exception}, "deliver"),
    "batch-size-text": ({"batch_size": "10"}, "batch_size"),
    "batch-size-zero": ({"batch_size": 0}, "batch_size"),
    "concurrency-float": ({"concurrency": 2.5}, "concurrency"),
    "backoff-nan": ({"backoff": [float("nan")]}, "backoff[0]"),
    "backoff-text": ({"backoff": "5"}, "backoff"),
    "backoff-empty": ({"backoff": []}, "backoff"),
    "max-attempts-text": ({"max_attempts": "3"}, "max_attempts"),
    "delivery-timeout-inf": ({"delivery_timeout": float("inf")}, "delivery_timeout"),
    "drain-every-text": ({"drain_every": "every minute"}, "drain_every"),
}


@pytest.mark.parametrize(
    ("call", "argument"), list(_BAD_OUTBOXES.values()), ids=list(_BAD_OUTBOXES)
)
def test_outbox_refuses_an_argument_it_cannot_use(call: dict[str, Any], argument: str) -> None:
    arguments: dict[str, Any] = {"name": "never_built", "deliver": _deliver} | call
    name, deliver = arguments.pop("name"), arguments.pop("deliver")
    with pytest.raises(OutboxArgumentError) as refused:
        Outbox(name, deliver, **arguments)
    assert refused.value.argument == argument
    assert str(refused.value).startswith(f"{argument}=")
    assert all(live.name != name for live in Outbox.live())


_BAD_TRIGGERS: dict[str, tuple[Callable[[], object], str]] = {
    "cron-none": (lambda: cron(None), "expression"),  # type: ignore[arg-type]
    "cron-int": (lambda: cron(5), "expression"),  # type: ignore[arg-type]
    "cron-tz-int": (lambda: cron("0 6 * * *", tz=5), "tz"),  # type: ignore[arg-type]
    "every-text": (lambda: every(seconds="5"), "seconds"),  # type: ignore[arg-type]
    "every-bool": (lambda: every(minutes=True), "minutes"),
    "every-nan": (lambda: every(hours=float("nan")), "hours"),
    "every-negative-part": (lambda: every(minutes=-1, seconds=120), "minutes"),
    "every-parts-past-ten-years": (lambda: every(days=3000, hours=72000), "period"),
}


@pytest.mark.parametrize(
    ("call", "argument"), list(_BAD_TRIGGERS.values()), ids=list(_BAD_TRIGGERS)
)
def test_a_trigger_refuses_an_argument_at_the_call(
    call: Callable[[], object], argument: str
) -> None:
    with pytest.raises(TriggerArgumentError) as refused:
        call()
    assert isinstance(refused.value, SchedulerError)
    assert refused.value.argument == argument
    assert f"{argument}=" in str(refused.value)
