"""The systems outside the app that jobs talk to, as protocols, with development defaults.

Production wires real implementations through ``JobDeps``; tests pass fakes. The
defaults only log, and say so, so a development server runs every job end to end.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = [
    "LOGGING_ONLY",
    "ChargeResult",
    "LoggingPaymentProvider",
    "LoggingSmsGateway",
    "NoUpdates",
    "PaymentProvider",
    "SmsGateway",
    "Update",
    "UpdatesSource",
]

logger = logging.getLogger("app.jobs.gateways")


class SmsGateway(Protocol):
    """Sends one SMS; raises on failure."""

    async def send(self, phone: str, text: str) -> None: ...


@dataclass(frozen=True)
class ChargeResult:
    """What the payment provider knows of a charge reference."""

    status: Literal["succeeded", "failed", "unknown"]
    charge_id: str | None = None


class PaymentProvider(Protocol):
    """Charges a subscription with an idempotency key (our reference)."""

    async def charge(self, reference: str, amount_cents: int) -> ChargeResult: ...

    async def lookup(self, reference: str) -> ChargeResult:
        """What became of the charge made with ``reference`` ("unknown": none was made)."""
        ...


@dataclass(frozen=True)
class Update:
    """One update from a long-poll source (a bot's getUpdates)."""

    update_id: int
    text: str


class UpdatesSource(Protocol):
    """A long-poll source: updates with id >= offset, waiting up to ``timeout``."""

    async def get_updates(self, offset: int, timeout: float) -> Sequence[Update]: ...


class LoggingSmsGateway:
    """Development default: logs the SMS instead of sending it."""

    async def send(self, phone: str, text: str) -> None:
        """Log the message; never fails."""
        logger.info("sms (not sent, logging gateway) to %s: %s", phone, text)


class LoggingPaymentProvider:
    """Development default: logs the charge and reports it succeeded."""

    def __init__(self) -> None:
        self._charges: dict[str, str] = {}

    async def charge(self, reference: str, amount_cents: int) -> ChargeResult:
        """Log the charge; the same reference returns the same charge id."""
        charge_id = self._charges.setdefault(reference, f"log_{uuid.uuid4().hex[:12]}")
        logger.info("charge (logging provider) %s: %s cents", reference, amount_cents)
        return ChargeResult("succeeded", charge_id)

    async def lookup(self, reference: str) -> ChargeResult:
        """What this process charged under ``reference``."""
        charge_id = self._charges.get(reference)
        return ChargeResult("succeeded", charge_id) if charge_id else ChargeResult("unknown")


class NoUpdates:
    """Development default: a source that never has updates."""

    async def get_updates(self, offset: int, timeout: float) -> Sequence[Update]:
        """Wait ``timeout`` seconds and return nothing, like an idle long poll."""
        import asyncio

        await asyncio.sleep(timeout)
        return ()


# The development defaults: each does nothing real, so production refuses them.
LOGGING_ONLY: tuple[type, ...] = (LoggingSmsGateway, LoggingPaymentProvider, NoUpdates)
