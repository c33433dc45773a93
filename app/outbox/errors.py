"""The outbox's exception hierarchy: one root, messages that say what to do."""

from __future__ import annotations

import reprlib
from datetime import datetime

from app.printable import printable

__all__ = [
    "MessageBusyError",
    "MessageDeliveredError",
    "MessageInFlightError",
    "OutboxArgumentError",
    "OutboxError",
    "OutboxNameTakenError",
    "PayloadError",
    "PermanentDeliveryError",
    "UnknownMessageError",
    "UnregisteredDrainError",
]


class OutboxError(Exception):
    """Root of every error the outbox raises."""


class OutboxArgumentError(OutboxError, ValueError):
    """Raised at the call (``Outbox(...)``, ``enqueue``) for an argument the outbox
    cannot store or use, before anything is written. ``argument`` names it, ``value``
    is what was passed, ``limit`` is the rule it broke; the message says what to pass
    instead. A ValueError too, for callers that catch those."""

    def __init__(self, argument: str, value: object, limit: str) -> None:
        self.argument = argument
        self.value = value
        self.limit = limit
        super().__init__(f"{argument}={printable(reprlib.repr(value))} is refused: {limit}")


class PermanentDeliveryError(OutboxError):
    """Raised by a ``deliver`` callable when retrying cannot help (a 4xx, a refusal):
    the row becomes ``stuck`` at once. Any other exception means "retry later"."""


class PayloadError(OutboxError, ValueError):
    """Raised at enqueue when the payload cannot be stored as JSON (a value that is not
    JSON, a string PostgreSQL cannot store, a container that holds itself, nesting past
    MAX_PAYLOAD_DEPTH); names the field and the fix."""


class UnregisteredDrainError(OutboxError):
    """Raised at start-up for an outbox whose drain is not on the app's scheduler:
    without a drain, a failed delivery would stay pending forever."""


class OutboxNameTakenError(OutboxError):
    """Raised at start-up for an outbox whose name another schedule's app drains in this
    database: outbox rows are per database, by name, so each app would deliver the
    other's rows. ``name`` is the outbox, ``schedule`` the schedule that has it,
    ``ours`` the one refused."""

    def __init__(self, name: str, schedule: str, ours: str) -> None:
        self.name = name
        self.schedule = schedule
        self.ours = ours
        super().__init__(
            f"outbox {name!r} is drained by schedule {schedule!r} in this database, so this "
            f"app of schedule {ours!r} would deliver that app's rows and that app this "
            "one's; outbox names are per database: give this outbox a name of its own "
            "(Outbox(name, ...)); after renaming a schedule, with every worker of the old "
            f"name stopped, hand the name over: UPDATE outbox_schedules SET schedule = "
            f"'{ours}' WHERE outbox = '{name}'"
        )


class UnknownMessageError(OutboxError):
    """Raised by reset for a message id that the named outbox does not have."""


class MessageDeliveredError(OutboxError):
    """Raised by reset for a row that was delivered: it is never sent again."""


class MessageInFlightError(OutboxError):
    """Raised by reset for a row a drain holds (claimed, its lease still running): the
    drain is delivering it, and a reset would let another drain deliver it again.
    ``message_id`` is the row; ``lease_until`` is when the claim runs out."""

    def __init__(self, outbox: str, message_id: int, lease_until: datetime) -> None:
        self.outbox = outbox
        self.message_id = message_id
        self.lease_until = lease_until
        super().__init__(
            f"outbox {outbox!r} message {message_id} is being delivered by a drain (its"
            f" claim runs until {lease_until.isoformat(timespec='seconds')}); wait for the"
            " drain to record the outcome, or retry the reset after that time"
        )


class MessageBusyError(OutboxError):
    """Raised by reset for a row another transaction held (an operator's psql session
    left open on ``SELECT ... FOR UPDATE``, a stuck script) past the reset's wait.
    ``held_by`` is that transaction's backend pid, None when it could not be named."""

    def __init__(self, outbox: str, message_id: int, held_by: int | None) -> None:
        self.outbox = outbox
        self.message_id = message_id
        self.held_by = held_by
        holder = "another transaction" if held_by is None else f"backend pid {held_by}"
        super().__init__(
            f"outbox {outbox!r} message {message_id} is held by another transaction"
            f" ({holder}), so it was not reset; end that transaction (see pg_stat_activity)"
            " and try again"
        )
