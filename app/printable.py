"""Text that came from data, made safe to print on a terminal or a log line.

Outbox keys, receivers' error bodies, job names and ids, host names: any of them can
carry control characters (ESC sequences that retitle or clear a terminal, BEL, CR and
LF that start a forged line, U+202E that reverses what follows) and invisible ones (a
zero-width space, a soft hyphen, a BOM, tag characters that hide text): "invoice-42"
and "invoice-\\u200b42" are two keys that would look alike. ``printable`` writes each
as a visible escape, so what data carries is shown, never obeyed; ``printable_name``
also tells apart names that differ by their spaces, a spelled escape or Unicode's
composition (letters of other scripts drawn alike stay alike). The CLI (app/cli/,
app/__main__.py) and the log formatter (app/logging.py) print through it; the admin
page's templates show every value through it, or through ``printable_text`` (line
breaks kept) for an error's text, then HTML escaping.
"""

from __future__ import annotations

import functools
import re
import unicodedata

__all__ = ["printable", "printable_name", "printable_text"]

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Controls (Cc: C0, DEL, C1), format characters (Cf: the bidirectional controls,
# zero-width spaces and joiners, the soft hyphen, U+FEFF, tag characters), the line and
# paragraph separators (a new line to some terminals and viewers), private-use,
# surrogate and unassigned code points (shown as nothing, or as one box whatever they
# are).
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cs", "Cn", "Zl", "Zp"})
# Default-ignorable code points of other categories, which a font draws as nothing: the
# combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian free
# variation selectors, variation selectors; and symbols drawn as a blank cell a letter
# wide (the braille pattern blank, the musical null notehead).
_IGNORABLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180e\u180f\u2800\u3164\uffa0\U0001d159"
) | frozenset(map(chr, [*range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)]))


def _hidden(char: str) -> bool:
    category = unicodedata.category(char)
    # A space other than U+0020 (no-break, en, em, thin, ideographic...) looks like one.
    space = category == "Zs" and char != " "
    return category in _HIDDEN_CATEGORIES or space or char in _IGNORABLE


@functools.cache
def _maybe_hidden() -> re.Pattern[str]:
    """One character class of every hidden code point of the Basic Multilingual Plane,
    and every code point above it (rare in text; _escape decides each), so that text is
    searched at the regular expression engine's speed, not a call per character. Built
    on first use from this Python's Unicode tables (some 50 ms)."""
    ranges: list[str] = []
    start: int | None = None
    for code in range(0x10001):
        if code < 0x10000 and _hidden(chr(code)):
            start = code if start is None else start
        elif start is not None:
            ranges.append(f"\\u{start:04x}-\\u{code - 1:04x}")
            start = None
    return re.compile("[" + "".join(ranges) + "\\U00010000-\\U0010ffff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    if not _hidden(char):  # above the BMP, and shown as it is
        return char
    return _NAMED.get(char) or _code(char)


def _code(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _escape_in_text(match: re.Match[str]) -> str:
    char = match.group()
    return char if char in _NAMED else _escape(match)


def printable_text(value: str) -> str:
    """``value`` as ``printable`` writes it, but for its line breaks (LF, CR) and tabs,
    which a page lays out as text: for an error's text on the admin page, where U+202E
    would otherwise reverse what follows it on screen."""
    if value.isascii() and value.isprintable():
        return value
    return _maybe_hidden().sub(_escape_in_text, value)


def printable(value: str) -> str:
    """``value`` with every control character (C0, DEL, C1), format character (the
    bidirectional controls, zero-width ones, the soft hyphen, tag characters), line and
    paragraph separator, space other than U+0020, and private-use, surrogate or
    unassigned code point written as a backslash escape (``\\x1b``, ``\\n``, ``\\xa0``,
    ``\\u202e``, ``\\U000e0041``): one line that moves no cursor and hides nothing. Other
    text, accents included, is kept."""
    if value.isascii() and value.isprintable():
        return value
    return _maybe_hidden().sub(_escape, value)


# Spaces a table or a page does not show as they are: at either end of a value (a
# column's padding, an HTML cell), or two and more in a row (laid out as one in HTML).
_UNSEEN_SPACES = re.compile(r"^ +| +$| {2,}")
_PAST_ASCII = re.compile(r"[^\x00-\x7f]")


def printable_name(value: str) -> str:
    """``value`` as ``printable`` writes it, for who something is (a key, an id, a
    name, a host), shown in a table's cell or a page's, so that two that differ look
    different: its spaces at either end or two and more in a row as ``\\x20``
    (``"invoice-42 "`` is not ``"invoice-42"``), a backslash as ``\\\\`` (text that spells
    an escape is not the character), and, when it is not in Unicode's composed form
    (NFC: ``"cafe\\u0301"`` is drawn as ``"café"`` is), every character past ASCII as
    its escape."""
    spelled = value.replace("\\", "\\\\")
    if not unicodedata.is_normalized("NFC", value):
        spelled = _PAST_ASCII.sub(lambda char: _code(char.group()), spelled)
    shown = printable(spelled)
    if not (shown.startswith(" ") or shown.endswith(" ") or "  " in shown):
        return shown
    return _UNSEEN_SPACES.sub(lambda spaces: "\\x20" * len(spaces.group()), shown)
