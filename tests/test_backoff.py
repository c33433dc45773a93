"""Every retry in Regent waits by one Backoff: a table walked a step per failure whose
last entry repeats, refused at construction when it cannot be walked."""

from __future__ import annotations

import pytest

from app.backoff import Backoff
from app.scheduler.retry import DATABASE, renewal_delay


def test_each_failure_in_a_row_waits_the_next_delay_and_the_last_repeats() -> None:
    backoff = Backoff((1.0, 2.0, 5.0))
    assert [backoff.delay(failures) for failures in range(1, 6)] == [1.0, 2.0, 5.0, 5.0, 5.0]


@pytest.mark.parametrize("delays", [(), (1.0, -1.0)])
def test_a_table_that_cannot_be_walked_is_refused_when_it_is_made(
    delays: tuple[float, ...],
) -> None:
    with pytest.raises(ValueError, match="Backoff"):
        Backoff(delays)


def test_failures_count_from_one() -> None:
    with pytest.raises(ValueError, match="counts from 1"):
        Backoff((1.0,)).delay(0)


def test_a_lease_is_renewed_each_period_and_a_failed_renewal_sooner() -> None:
    period = 2.0
    assert renewal_delay(period, 0) == period
    assert renewal_delay(period, 1) == DATABASE.delay(1) < period
    assert renewal_delay(period, 9) == period
