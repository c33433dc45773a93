"""The outbox's exception hierarchy: one root, messages that say what to do."""

from __future__ import annotations

__all__ = [
    "MessageDeliveredError",
    "OutboxError",
    "PayloadError",
    "PermanentDeliveryError",
    "UnknownMessageError",
    "UnregisteredDrainError",
]


class OutboxError(Exception):
    """Root of every error the outbox raises."""


class PermanentDeliveryError(OutboxError):
    """Raised by a ``deliver`` callable when retrying cannot help (a 4xx, a refusal):
    the row becomes ``stuck`` at once. Any other exception means "retry later"."""


class PayloadError(OutboxError):
    """Raised at enqueue when the payload cannot be stored as JSON; names the field."""


class UnregisteredDrainError(OutboxError):
    """Raised at start-up for an outbox whose drain is not on the app's scheduler:
    without a drain, a failed delivery would stay pending forever."""


class UnknownMessageError(OutboxError):
    """Raised by reset for a message id that the named outbox does not have."""


class MessageDeliveredError(OutboxError):
    """Raised by reset for a row that was delivered: it is never sent again."""
