"""Regent's outbox: work that must eventually happen, delivered by a drain.

A row is written in the same transaction as the change that promises it
(``await outbox.enqueue(session, payload, key=...)``); the drain, a scheduler job,
delivers it with backoff (5, 15, 60, 300, 900, 3600 s), marks a refused or exhausted
row ``stuck``; only retention deletes rows, delivered ones (retention.py). The receiver
gets ``<outbox>:<key>`` as an idempotency key on every attempt; a key the deliverer
cannot send (HttpTransport: not printable ASCII) is refused at enqueue. An enqueue's
commit wakes the leader's drain through NOTIFY, so delivery does not wait for the next
tick.
"""

from .backoff import DEFAULT_BACKOFF, retry_delay
from .errors import (
    MessageBusyError,
    MessageDeliveredError,
    MessageInFlightError,
    OutboxError,
    OutboxNameTakenError,
    PayloadError,
    PermanentDeliveryError,
    UndeliverableKeyError,
    UnknownMessageError,
    UnregisteredDrainError,
)
from .http import HEADER_KEY_RULE, HttpTransport, RetryableDeliveryError, header_safe_key
from .message import DrainReport, Enqueued, Message
from .outbox import Deliver, Outbox, reset_message

__all__ = [
    "DEFAULT_BACKOFF",
    "HEADER_KEY_RULE",
    "Deliver",
    "DrainReport",
    "Enqueued",
    "HttpTransport",
    "Message",
    "MessageBusyError",
    "MessageDeliveredError",
    "MessageInFlightError",
    "Outbox",
    "OutboxError",
    "OutboxNameTakenError",
    "PayloadError",
    "PermanentDeliveryError",
    "RetryableDeliveryError",
    "UndeliverableKeyError",
    "UnknownMessageError",
    "UnregisteredDrainError",
    "header_safe_key",
    "reset_message",
    "retry_delay",
]
