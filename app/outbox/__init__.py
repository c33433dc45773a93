"""Regent's outbox: work that must eventually happen, delivered by a drain.

A row is written in the same transaction as the change that promises it
(``await outbox.enqueue(session, payload, key=...)``), due at once or, with ``at=``
(an aware datetime) or ``delay=`` (a timedelta), at a later moment on the database's
clock, never before it; the drain, a scheduler job, delivers it with backoff (5, 15,
60, 300, 900, 3600 s) and marks a refused or exhausted row ``stuck``; only retention
deletes rows, delivered ones (retention.py). The receiver gets ``<outbox>:<key>`` as
an idempotency key on every attempt; a key the deliverer cannot send (HttpTransport:
not printable ASCII) is refused at enqueue. An enqueue's commit wakes the leader's
drain through NOTIFY, and the drain sleeps until the next row falls due, so delivery
waits for no tick. A value the outbox cannot store or use is refused at the call,
before anything is written, with an OutboxArgumentError (or PayloadError) naming the
argument.
"""

from .arguments import MAX_KEY_BYTES, MAX_NAME_LENGTH
from .errors import (
    MessageBusyError,
    MessageDeliveredError,
    MessageInFlightError,
    OutboxArgumentError,
    OutboxError,
    OutboxNameTakenError,
    PayloadError,
    PermanentDeliveryError,
    UnknownMessageError,
    UnregisteredDrainError,
)
from .http import (
    HEADER_KEY_PATTERN,
    HEADER_KEY_RULE,
    HttpTransport,
    RetryableDeliveryError,
    header_safe_key,
)
from .message import DrainReport, Enqueued, Message, StuckReset
from .outbox import Deliver, Outbox, drain_job_id
from .payload import MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH
from .policy import DEFAULT_BACKOFF, retry_delay
from .resets import reset_message, reset_stuck

__all__ = [
    "DEFAULT_BACKOFF",
    "HEADER_KEY_PATTERN",
    "HEADER_KEY_RULE",
    "MAX_KEY_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_PAYLOAD_BYTES",
    "MAX_PAYLOAD_DEPTH",
    "Deliver",
    "DrainReport",
    "Enqueued",
    "HttpTransport",
    "Message",
    "MessageBusyError",
    "MessageDeliveredError",
    "MessageInFlightError",
    "Outbox",
    "OutboxArgumentError",
    "OutboxError",
    "OutboxNameTakenError",
    "PayloadError",
    "PermanentDeliveryError",
    "RetryableDeliveryError",
    "StuckReset",
    "UnknownMessageError",
    "UnregisteredDrainError",
    "drain_job_id",
    "header_safe_key",
    "reset_message",
    "reset_stuck",
    "retry_delay",
]
