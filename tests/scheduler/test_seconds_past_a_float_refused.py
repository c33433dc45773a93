"""A duration too large for a float (an int such as 10**400) is refused with Regent's own
error naming the argument, as every duration past ten years is: never a raw
OverflowError from converting it."""

from __future__ import annotations

from typing import Any

import pytest

from app.scheduler import InvalidJobError, JobContext, Scheduler, TriggerArgumentError, every

HUGE = 10**400


async def _job(ctx: JobContext) -> None:
    """A job never run: only its registration is looked at."""


@pytest.mark.parametrize("unit", ["seconds", "minutes", "hours", "days"])
def test_every_refuses_a_period_past_a_float_naming_the_unit(unit: str) -> None:
    with pytest.raises(TriggerArgumentError) as refused:
        every(**{unit: HUGE})
    assert refused.value.argument == unit


@pytest.mark.parametrize("option", ["first_run", "timeout", "jitter", "misfire_grace"])
def test_a_job_option_past_a_float_is_refused_naming_the_option(option: str) -> None:
    with pytest.raises(InvalidJobError, match=f"{option} must be a number of seconds"):
        options: dict[str, Any] = {option: HUGE}
        Scheduler().job(every(minutes=1), id="huge", **options)(_job)
