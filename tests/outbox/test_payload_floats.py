"""A float in a payload reaches the receiver as the float it was: jsonb stores numbers as
numeric and writes ``1e+16`` back as ``10000000000000000``, which json.loads reads as an
int (and ``1.5e300`` as an int that is not even equal to the float), so a float whose
repr has a positive exponent is stored in positional form with a ``.0``."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import sys
import tracemalloc
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text

from app import testing
from app.db import Database
from app.outbox import HttpTransport, PayloadError
from app.outbox import payload as payload_module
from app.outbox.payload import dump_payload

from .conftest import FakeReceiver, MakeOutbox

PAYLOAD: dict[str, Any] = {
    "big": 1e16,
    "huge": 1.5e300,
    "neg": -2.5e20,
    "small": 1e-7,
    "tenth": 0.1,
    "three": 3.0,
    "int": 10**20,
    "nested": [[1, [2.5e17, "x"]], {"deep": [-9.875e123]}],
    "beside": {"text": 'looks like 1e+16 "and" \\ 2e+5', "value": 7e22},
    "1e+16": "a key that looks like a float",
    "largest": sys.float_info.max,
    "tiniest": 5e-324,
}


def _typed(value: Any) -> Any:
    """``value`` with every number paired with its type: 1.0 and 1 differ."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value), value)


async def test_a_float_reaches_the_receiver_as_the_float_it_was(
    database: Database, make_outbox: MakeOutbox, receiver: FakeReceiver
) -> None:
    outbox = make_outbox("floats")
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, PAYLOAD, key="k")
    await testing.drain(outbox)
    [message] = receiver.calls
    assert _typed(message.payload) == _typed(PAYLOAD)


async def test_a_float_reaches_the_inline_attempt_as_the_float_it_was(
    database: Database, make_outbox: MakeOutbox, receiver: FakeReceiver
) -> None:
    outbox = make_outbox("floats")
    async with database.sessions() as session, session.begin():
        row_id = (await outbox.enqueue(session, PAYLOAD, key="k")).id
    await outbox.attempt(row_id)
    [message] = receiver.calls
    assert _typed(message.payload) == _typed(PAYLOAD)


async def test_a_float_enqueued_from_sync_code_reaches_the_receiver_as_the_float_it_was(
    database: Database, make_outbox: MakeOutbox, receiver: FakeReceiver
) -> None:
    outbox = make_outbox("floats")

    def thread_job() -> None:
        with database.sync_sessions() as session, session.begin():
            outbox.enqueue_sync(session, PAYLOAD, key="k")

    await asyncio.to_thread(thread_job)
    await testing.drain(outbox)
    [message] = receiver.calls
    assert _typed(message.payload) == _typed(PAYLOAD)


async def test_a_float_reaches_an_http_receiver_as_the_float_it_was(
    database: Database, make_outbox: MakeOutbox
) -> None:
    bodies: list[bytes] = []

    def answer(request: httpx.Request) -> httpx.Response:
        bodies.append(request.read())
        return httpx.Response(200)

    client = httpx.AsyncClient(transport=httpx.MockTransport(answer))
    outbox = make_outbox("floats", deliver=HttpTransport("http://receiver.test/", client=client))
    async with database.sessions() as session, session.begin():
        await outbox.enqueue(session, PAYLOAD, key="k")
    await testing.drain(outbox)
    await client.aclose()
    [body] = bodies
    assert _typed(json.loads(body)) == _typed(PAYLOAD)


def _random_floats(count: int) -> list[float]:
    """Floats from every part of the range: random bit patterns, finite ones kept."""
    rng = random.Random(25)
    floats: list[float] = []
    while len(floats) < count:
        (value,) = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))
        if value == value and abs(value) != float("inf"):
            floats.append(value)
    return floats


async def test_every_finite_float_comes_back_from_jsonb_as_itself(database: Database) -> None:
    floats = [*_random_floats(5000), 1e16, 9007199254740993.0, 1e22, 1e23, -1e308, 2.0**1000]
    async with database.engine.connect() as conn:
        stored = (
            await conn.execute(
                text("SELECT CAST(:payload AS jsonb)::text"),
                {"payload": dump_payload("floats", floats)},
            )
        ).scalar_one()
    back = json.loads(stored)
    assert [(type(x), x) for x in back] == [(float, x) for x in floats]


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_is_written_in_a_form_json_reads_back_as_that_float(value: float) -> None:
    for payload in (value, [value], {"v": value, "s": "e+1"}):
        assert _typed(json.loads(dump_payload("floats", payload))) == _typed(payload)
        # The form jsonb keeps: no exponent that numeric would write back without a scale.
        assert "e+" not in dump_payload("floats", [value])


def test_the_size_limit_counts_floats_as_they_are_stored(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = [1.5e300] * 10  # 99 characters as json.dumps writes it, 3k as stored
    monkeypatch.setattr(payload_module, "MAX_PAYLOAD_BYTES", 1000)
    with pytest.raises(PayloadError, match="MAX_PAYLOAD_BYTES"):
        dump_payload("floats", payload)


def test_a_dict_of_mixed_key_types_has_its_floats_stored_as_floats() -> None:
    payload = {1: 1e16, "b": [2e300]}  # cannot be sorted: dumped unsorted, after a walk
    stored = dump_payload("floats", payload)
    assert "e+" not in stored
    assert _typed(json.loads(stored)) == _typed({"1": 1e16, "b": [2e300]})


# Strings made of what can look like a float with an exponent, or end a string early.
_TRICKY_TEXT = st.text(alphabet='"\\e+1.5:,[]{} \n', max_size=8)
_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY_TEXT, inner, max_size=4),
    max_leaves=30,
)


@given(_VALUES)
def test_floats_are_rewritten_and_strings_left_as_they_were(value: Any) -> None:
    assert _typed(json.loads(dump_payload("floats", value))) == _typed(value)


def test_a_payload_too_large_once_its_floats_are_written_out_is_refused_unbuilt() -> None:
    # 3.2 MB of JSON text; stored, each 1e+308 is 309 digits and ".0": 125 MB.
    payload = [1e308] * 400_000
    text_size = len(json.dumps(payload))
    tracemalloc.start()
    try:
        with pytest.raises(PayloadError, match="MAX_PAYLOAD_BYTES"):
            dump_payload("big", payload)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * text_size
