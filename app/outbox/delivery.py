"""One delivery of a claimed row, and the Outcome it ended with: delivered; retried,
due again after the policy's backoff; or stuck, refused by the receiver
(PermanentDeliveryError) or out of attempts (max_attempts). A delivery is cut off at
the policy's delivery_timeout, so it ends well within its claim's lease (claim.py)."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass

from app.storable import escape_unstorable

from .claim import Claim
from .errors import PermanentDeliveryError
from .message import Message
from .policy import DrainPolicy

__all__ = ["Outcome", "deliver"]


@dataclass(frozen=True)
class Outcome:
    """A delivery that ended, waiting for its outcome to be written. ``error`` is None
    for a delivered row."""

    claim: Claim
    message: Message
    error: str | None = None
    stuck: bool = False
    retry_in: float | None = None

    @property
    def name(self) -> str:
        """``delivered``, ``stuck`` or ``retried``: the report's count it adds to."""
        if self.error is None:
            return "delivered"
        return "stuck" if self.stuck else "retried"

    @property
    def token(self) -> uuid.UUID:
        """The token of the claim the row was delivered under."""
        return self.claim.token


async def deliver(policy: DrainPolicy, claim: Claim, message: Message) -> Outcome:
    """Deliver ``message`` (of ``claim``) through the policy's receiver, cut off at its
    delivery_timeout; the outcome, never an exception from the receiver."""
    try:
        async with asyncio.timeout(policy.delivery_timeout):
            await policy.deliver(message)
    except PermanentDeliveryError as exc:
        return _failed(policy, claim, message, exc, permanent=True)
    except Exception as exc:
        return _failed(policy, claim, message, exc, permanent=False)
    return Outcome(claim, message)


def _failed(
    policy: DrainPolicy, claim: Claim, message: Message, exc: BaseException, *, permanent: bool
) -> Outcome:
    attempts = message.attempts + 1
    error = escape_unstorable(f"{exc.__class__.__name__}: {exc}"[:2000])
    if isinstance(exc, TimeoutError):
        error = f"no answer within delivery_timeout={policy.delivery_timeout:g} s"
    return Outcome(
        claim,
        message,
        error=error,
        stuck=permanent or attempts >= policy.max_attempts,
        retry_in=policy.backoff.delay(attempts),
    )
