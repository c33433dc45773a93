"""The receiver's judgement of a redelivery, at the edge of a delivery's lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from .effects import Delivery

T0 = datetime(2026, 3, 27, 23, 0, 36, tzinfo=UTC)


def test_a_delivery_that_ends_as_its_lease_ends_may_come_again() -> None:
    # The outbox claims a row whose next_attempt_at <= now: from the lease's last
    # instant on, another drain may take the row and deliver it again.
    lease_until = T0 + timedelta(seconds=35)
    delivery = Delivery(start=T0, end=lease_until, lease_until=lease_until)
    assert delivery.may_come_again
