"""A payload's nesting is read from its JSON text, brackets inside strings not counted:
the depth limit refuses exactly the payloads nested past it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.outbox import MAX_PAYLOAD_DEPTH, PayloadError
from app.outbox.payload import _nests_deeper_than, dump_payload

# Strings made of what can fool a reading of JSON text: brackets, quotes, backslashes.
_TRICKY_TEXT = st.text(alphabet='[]{}"\\\\ab\\n', max_size=6)
_VALUES = st.recursive(
    st.none() | st.integers() | _TRICKY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TRICKY_TEXT, inner, max_size=3),
    max_leaves=30,
)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _wrapped(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


@given(_VALUES)
def test_a_payload_nested_to_the_limit_is_accepted_whatever_its_strings_hold(value: Any) -> None:
    payload = _wrapped(value, MAX_PAYLOAD_DEPTH - _depth(value))
    assert json.loads(dump_payload("depth", payload)) == payload


@given(_VALUES)
def test_a_payload_nested_past_the_limit_is_refused_whatever_its_strings_hold(value: Any) -> None:
    payload = _wrapped(value, MAX_PAYLOAD_DEPTH + 1 - _depth(value))
    with pytest.raises(PayloadError, match=f"more than {MAX_PAYLOAD_DEPTH}"):
        dump_payload("depth", payload)


@given(_VALUES)
def test_the_depth_read_from_the_text_is_the_payloads_own(value: Any) -> None:
    # A wrong reading only costs a walk when it errs high; exact, it costs none.
    text = json.dumps(value, ensure_ascii=False)
    depth = _depth(value)
    assert _nests_deeper_than(text, depth) is False
    assert depth == 0 or _nests_deeper_than(text, depth - 1) is True
