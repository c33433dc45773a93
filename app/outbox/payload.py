"""Turning a payload into the JSON text a jsonb column stores, or a PayloadError that
names the field which cannot be, and why.

The common case costs one ``json.dumps`` (keys sorted: jsonb keeps its own key order, and
sorting is what finds a dict whose keys are of mixed types, the only kind where two keys
can become one JSON key, ``1`` and ``'1'``) and a few scans of its text in C. Only when
that fails, or the text may hold something jsonb refuses (a NUL, a lone surrogate) or
nests too deep (read from its brackets outside its strings), is the payload walked,
iteratively (a walk cannot overflow the stack), to check it and name the first bad
field.

A float whose repr has a positive exponent (``1e+16``, ``1.5e+300``: magnitude 1e16 and
up) is written in positional form with a ``.0`` (``10000000000000000.0``): jsonb stores
numbers as numeric and writes ``1e+16`` back as ``10000000000000000``, which json.loads
reads as an int (for 1.5e300, an int not even equal to the float). Only a text holding
``e+`` is searched for them, from each ``e+`` (C-speed: a regular expression with a
literal start, and quote counts that tell an ``e+`` in a string from one in a number).
"""

from __future__ import annotations

import json
import re
import reprlib
import sys
from decimal import Decimal
from typing import Any

from app.storable import is_storable_text

from .errors import PayloadError

__all__ = ["MAX_PAYLOAD_BYTES", "MAX_PAYLOAD_DEPTH", "dump_payload"]

MAX_PAYLOAD_DEPTH = 500
"""The deepest nesting of lists and objects a payload may have. The drain decodes each
claimed payload with json.loads, which stops at Python's recursion limit (1000 frames,
less the drain's own): a payload nested some 990 deep would be stored and then fail
every claim of its outbox. 500 leaves the drain room, and is far past any message's
(PostgreSQL's jsonb itself takes some thousands)."""

MAX_PAYLOAD_BYTES = 16 * 1024 * 1024
"""The longest payload, as UTF-8 JSON text. jsonb refuses a value past 256 MiB in its
own binary form, which can be several times the text (a list of small numbers: some
six times), and every claim of the row reads the payload whole into the drain's
memory. A message is an instruction, not a document: past this, store the content
elsewhere and enqueue its address."""

_OPENERS = ("[", "{")
# Outside its strings, JSON text is ASCII: this keeps its brackets alone, all as [ and ]
# (nesting is what counts, and a pass must not take a { } emptied by the same pass).
_BRACKETS_ONLY: dict[int, str | None] = {
    code: None for code in range(128) if chr(code) not in "[]{}"
} | {ord("{"): "[", ord("}"): "]"}

# A positive exponent, as float.__repr__ writes it (json.dumps writes ints without one),
# and the mantissa before it: at most 17 digits, a point and a sign.
_POSITIVE_EXPONENT = re.compile(r"e\+[0-9]+")
_MANTISSA = re.compile(r"-?[0-9]+(?:\.[0-9]+)?\Z")
_MANTISSA_LENGTH = 19


def dump_payload(outbox: str, payload: Any) -> str:
    """The payload as JSON text jsonb accepts, holding every key it was given. Raises
    PayloadError naming the first bad field: a value that is not JSON (or NaN, or an int
    too long to write), a string or key with a NUL character or a lone surrogate, two
    keys of one dict that are one JSON key (``1`` and ``'1'``), a list or dict that
    contains itself, nesting past MAX_PAYLOAD_DEPTH; and for a payload whose text is
    longer than MAX_PAYLOAD_BYTES."""
    try:
        text = json.dumps(payload, allow_nan=False, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError, RecursionError) as exc:
        text = _dump_checked(outbox, payload, exc)
    # Superset checks: an escaped NUL, any non-UTF-8 text, or nesting that deep. The
    # walk decides, and names the field.
    suspect = (
        "\\u0000" in text
        or not (text.isascii() or is_storable_text(text))
        or _nests_deeper_than(text, MAX_PAYLOAD_DEPTH)
    )
    if suspect:
        problem = _first_problem(payload)
        if problem is not None:
            raise PayloadError(f"outbox {outbox!r}: {problem}")
    if "e+" in text:  # a float jsonb would give back as an int, or text that says e+
        written = _positional_floats(text, MAX_PAYLOAD_BYTES)
        if written is None:
            raise _too_large(outbox, f"more than {MAX_PAYLOAD_BYTES:,}")
        text = written
    # A character is at most four bytes: only a long text is encoded to be measured.
    if len(text) * 4 > MAX_PAYLOAD_BYTES and len(text.encode()) > MAX_PAYLOAD_BYTES:
        raise _too_large(outbox, f"{len(text.encode()):,}")
    return text


def _too_large(outbox: str, size: str) -> PayloadError:
    return PayloadError(
        f"outbox {outbox!r}: payload is {size} bytes of JSON, past MAX_PAYLOAD_BYTES"
        f" ({MAX_PAYLOAD_BYTES:,}); store the content elsewhere and enqueue its address"
    )


def _positional_floats(text: str, limit: int) -> str | None:
    """``text`` (json.dumps output) with each float written with a positive exponent
    rewritten in positional form with a ``.0``, which jsonb's numeric keeps as written
    and json.loads reads back as the same float; the text itself when it has none.
    None as soon as the text written would pass ``limit`` characters (each ``1e+308``
    grows by 300), before it is built."""
    # The text with its escaped backslashes and quotes masked, each by as many
    # characters: every " left opens or closes a string, at the text's own positions.
    masked = text.replace("\\\\", "__").replace('\\"', "__")
    pieces: list[str] = []
    written = counted = quotes = grown = 0
    for exponent in _POSITIVE_EXPONENT.finditer(masked):  # found from its literal "e+"
        at = exponent.start()
        quotes += masked.count('"', counted, at)
        counted = at
        if quotes % 2:
            continue  # in a string: text that says e+
        mantissa = _MANTISSA.search(masked, max(written, at - _MANTISSA_LENGTH), at)
        if mantissa is None:  # not json.dumps output: left as it is
            continue
        start = mantissa.start()
        positional = _positional(text[start : exponent.end()])
        grown += len(positional) - (exponent.end() - start)
        if len(text) + grown > limit:
            return None
        pieces += (text[written:start], positional)
        written = exponent.end()
    if not pieces:
        return text
    pieces.append(text[written:])
    return "".join(pieces)


def _positional(number: str) -> str:
    """A float's repr with a positive exponent (``1.5e+300``) in positional form with a
    ``.0`` (``15`` and 299 zeros ``.0``): exact, as repr is."""
    written = format(Decimal(number), "f")
    return written if "." in written else f"{written}.0"


def _nests_deeper_than(text: str, depth: int) -> bool:
    """Whether the JSON ``text`` json.dumps wrote nests more than ``depth`` lists and
    objects. In C-speed string operations (a large payload costs about one more
    json.dumps, where walking it cost eight)."""
    if sum(text.count(opener) for opener in _OPENERS) <= depth:
        return False  # fewer brackets than that, counting those in strings
    # JSON writes a backslash only in a string, as \\ or \" (or \n, ...): with those
    # two gone, every " opens or closes a string, and what is outside them is structure.
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    brackets = "".join(unescaped.split('"')[0::2]).translate(_BRACKETS_ONLY)
    for _ in range(depth):  # each pass takes the innermost lists and objects away
        if not brackets:
            return False
        brackets = brackets.replace("[]", "")
    return bool(brackets)


def _dump_checked(outbox: str, payload: Any, exc: BaseException) -> str:
    """The text of a payload ``json.dumps`` refused with sorted keys, once the walk found
    nothing wrong in it (a dict whose keys are of mixed types, none two of them one JSON
    key, cannot be sorted), or a PayloadError naming what is wrong."""
    problem = _first_problem(payload)
    if problem is not None:
        raise PayloadError(f"outbox {outbox!r}: {problem}")
    try:
        return json.dumps(payload, allow_nan=False, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError) as unsorted:
        raise PayloadError(
            f"outbox {outbox!r}: payload is not JSON ({unsorted or exc});"
            " convert it before enqueueing"
        ) from None


def _first_problem(payload: Any) -> str | None:
    """What is wrong with the first bad field of ``payload``, in document order, or None."""
    # Depth-first, iteratively; an "exit" entry takes a container off the path that a
    # cycle is looked for in.
    stack: list[tuple[bool, Any, str, int]] = [(True, payload, "payload", 1)]
    on_path: set[int] = set()
    while stack:
        entering, value, path, depth = stack.pop()
        if not entering:
            on_path.discard(id(value))
            continue
        if isinstance(value, str):
            problem = _text_problem(value)
            if problem is not None:
                return f"{path} {problem}"
            continue
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, int):
            if _too_long(value):
                return f"{path} is {_too_long_text()}, which JSON cannot write; send it as a str"
            continue
        if isinstance(value, float):
            if value != value or value in (float("inf"), float("-inf")):
                return f"{path} is float {value!r}, which is not JSON; send null or a string"
            continue
        if not isinstance(value, dict | list | tuple):
            return (
                f"{path} is {type(value).__name__} {reprlib.repr(value)}, which is not JSON;"
                " convert it (str(), float(), .isoformat()) before enqueueing"
            )
        if id(value) in on_path:
            return (
                f"{path} contains itself (a reference cycle), which JSON cannot hold;"
                " enqueue a copy without the cycle"
            )
        if depth > MAX_PAYLOAD_DEPTH:
            return (
                f"{path[:120]}... nests more than {MAX_PAYLOAD_DEPTH} lists and objects"
                " deep (MAX_PAYLOAD_DEPTH); flatten it"
            )
        on_path.add(id(value))
        stack.append((False, value, path, depth))
        children: list[tuple[bool, Any, str, int]] = []
        if isinstance(value, dict):
            written: dict[str, Any] = {}  # each key as JSON writes it: the key it came from
            for key, item in value.items():
                problem, as_written = _key_problem(key)
                if problem is not None:
                    return f"{path} key {_shown(key)} {problem}"
                if as_written in written:
                    return (
                        f"{path} keys {_shown(written[as_written])} and {_shown(key)} are"
                        f" both {json.dumps(as_written)} in JSON, where an object keeps one"
                        " of them; make them distinct str keys"
                    )
                written[as_written] = key
                children.append((True, item, f"{path}[{_shown(key)}]", depth + 1))
        else:
            children = [
                (True, item, f"{path}[{index}]", depth + 1) for index, item in enumerate(value)
            ]
        stack.extend(reversed(children))
    return None


def _key_problem(key: object) -> tuple[str | None, str]:
    """What is wrong with a dict key, or None and the key JSON writes for it."""
    if isinstance(key, str):
        return _text_problem(key), key
    if key is None or isinstance(key, bool):
        return None, json.dumps(key)
    if isinstance(key, int):
        if _too_long(key):
            return f"is {_too_long_text()}, which JSON cannot write; use str keys", ""
        return None, str(key)
    if isinstance(key, float):
        if key != key or key in (float("inf"), float("-inf")):
            return "is a float that is not JSON; use str keys", ""
        return None, float.__repr__(key)
    return (
        f"is {type(key).__name__}, which a JSON object cannot have; use str keys",
        "",
    )


def _too_long(number: int) -> bool:
    """Whether Python refuses to write ``number`` (more digits than
    sys.set_int_max_str_digits allows)."""
    if number.bit_length() < 3 * sys.get_int_max_str_digits():  # fewer digits than that
        return False
    try:
        str(number)
    except ValueError:
        return True
    return False


def _too_long_text() -> str:
    return f"an int of more than {sys.get_int_max_str_digits()} digits"


def _shown(key: object) -> str:
    """A key as a message shows it: its repr, shortened, or what it is when Python
    refuses to write it."""
    if isinstance(key, int) and _too_long(key):
        return f"<{_too_long_text()}>"
    return reprlib.repr(key)


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return (
            "contains a NUL character (\\x00), which PostgreSQL cannot store;"
            " remove it, or encode binary data (base64)"
        )
    if not is_storable_text(text):
        return (
            "contains a lone UTF-16 surrogate, which is not valid UTF-8 and PostgreSQL"
            " cannot store; decode the bytes it came from with errors='replace'"
        )
    return None
