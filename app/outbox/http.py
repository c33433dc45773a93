"""An httpx transport for outboxes: POST the payload, map the answer to an outcome.

| answer                                         | outcome           |
|------------------------------------------------|-------------------|
| 2xx                                            | delivered         |
| 408, 429, 5xx, a timeout, a connection error   | retry (raises)    |
| any other 4xx                                  | stuck (permanent) |

The error of a failed attempt names the URL with its credentials redacted (userinfo,
``token=`` and other secret-named query values), since the row keeps it and the drain
logs it.

Every attempt carries ``Idempotency-Key: <outbox>:<key>``, so a receiver that got a
delivery whose answer was lost recognises the retry. A header carries visible ASCII
only, and a key may be any text, so the value is sent by one rule (``header_value``):

- unchanged when it is visible ASCII with spaces only inside (HEADER_KEY_PATTERN) and
  holds no ``=?``: every key of letters, digits and punctuation, as it always was;
- otherwise as one RFC 2047 encoded-word of its UTF-8, ``=?UTF-8?B?<base64>?=`` (longer
  than RFC 2047's 75 characters when the key is: HTTP sets no such limit), which a
  receiver decodes with a standard decoder (Python: ``email.header.decode_header``).

Unchanged values hold no ``=?`` and encoded ones begin with it, so two keys never share
a header, and a standard decoder gives back every value exactly.
"""

from __future__ import annotations

import base64
import re
from typing import TYPE_CHECKING

from app.redact import redact

from .errors import PermanentDeliveryError
from .message import Message

if TYPE_CHECKING:
    import httpx

__all__ = [
    "HEADER_KEY_PATTERN",
    "HEADER_KEY_RULE",
    "HttpTransport",
    "RetryableDeliveryError",
    "header_safe_key",
    "header_value",
]

_RETRYABLE_4XX = frozenset({408, 429})

HEADER_KEY_RULE = (
    "a key sent in the Idempotency-Key header must be printable ASCII (letters, digits, "
    "punctuation, and spaces between them): no accents, no control characters, no space "
    "at either end"
)
HEADER_KEY_PATTERN = r"^[!-~](?:[ -~]*[!-~])?$"
"""HEADER_KEY_RULE as a regular expression (anchored, so a JSON Schema ``pattern`` too):
visible ASCII, with spaces only inside, as a receiver trims a header value's ends."""
_HEADER_SAFE = re.compile(HEADER_KEY_PATTERN)


def header_value(value: str) -> str:
    """``value`` as an HTTP header carries it, by the rule in this module's docstring:
    itself when a header can carry it and it holds no ``=?``, else an RFC 2047
    encoded-word of its UTF-8. Distinct values give distinct results."""
    if _HEADER_SAFE.fullmatch(value) is not None and "=?" not in value:
        return value
    return f"=?UTF-8?B?{base64.b64encode(value.encode('utf-8')).decode('ascii')}?="


def header_safe_key(key: str) -> str:
    """``key`` when an HTTP header can carry it; ValueError saying the rule otherwise
    (for a model field: the message names no value)."""
    if _HEADER_SAFE.fullmatch(key) is None:
        raise ValueError(f"{HEADER_KEY_RULE}; encode it first (e.g. percent-encoding)")
    return key


class RetryableDeliveryError(Exception):
    """The receiver answered with a status that a later attempt may get past."""


class HttpTransport:
    """``deliver`` for an Outbox: POSTs each message's payload as JSON to ``url``."""

    def __init__(
        self, url: str, *, timeout: float = 30, client: httpx.AsyncClient | None = None
    ) -> None:
        # httpx (0.13 s to import) only once a transport is made: every `python -m app`
        # command imports the outbox, and most never send.
        import httpx

        self.url = url
        self.timeout = timeout
        self._client = client or httpx.AsyncClient(timeout=timeout)
        self._http_error = httpx.HTTPError

    async def __call__(self, message: Message) -> None:
        """Deliver or raise: PermanentDeliveryError for a refusal, anything else to retry."""
        try:
            response = await self._client.post(
                self.url,
                json=message.payload,
                headers={"Idempotency-Key": header_value(message.idempotency_key)},
                timeout=self.timeout,
            )
        except self._http_error as exc:
            # The drain stores and logs this text: it must not carry the URL's secrets.
            raise RetryableDeliveryError(
                redact(f"POST {self.url}: {exc.__class__.__name__}: {exc}")
            ) from None
        status = response.status_code
        if 200 <= status < 300:
            return
        detail = redact(f"{self.url} answered {status}: {response.text[:200]}")
        if 400 <= status < 500 and status not in _RETRYABLE_4XX:
            raise PermanentDeliveryError(detail)
        raise RetryableDeliveryError(detail)

    async def aclose(self) -> None:
        """Close the underlying HTTP client."""
        await self._client.aclose()
