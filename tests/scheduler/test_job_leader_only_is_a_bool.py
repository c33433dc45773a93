"""``leader_only`` is a bool: any other value ('no', 0, None) is refused at registration
naming it, rather than read for its truth (``leader_only='no'`` would run the job on
the leader only)."""

from __future__ import annotations

import pytest

from app.scheduler import InvalidJobError, JobContext, Scheduler, every


async def _job(ctx: JobContext) -> None:
    """A job never run: only its registration is looked at."""


@pytest.mark.parametrize("value", ["no", "false", 0, 1, None])
def test_a_leader_only_that_is_not_a_bool_is_refused_naming_it(value: object) -> None:
    scheduler = Scheduler()
    with pytest.raises(InvalidJobError, match="leader_only must be True or False"):
        scheduler.job(every(minutes=1), id="flagged", leader_only=value)(_job)  # type: ignore[arg-type]
    assert "flagged" not in scheduler.jobs
