"""Registration fails at once, naming the job, for every declaration mistake."""

import pytest

from app.scheduler import InvalidJobError, JobContext, Scheduler, cron, every


async def _noop(ctx: JobContext) -> None:
    return None


def test_bad_cron_string_names_the_job() -> None:
    with pytest.raises(InvalidJobError, match=r'job "nightly": cron expression .*five fields'):
        Scheduler().job(cron("0 25 * * *"), id="nightly")(_noop)


def test_six_field_cron_is_refused() -> None:
    with pytest.raises(InvalidJobError, match="five fields"):
        Scheduler().job(cron("0 0 6 * * *"), id="seconds")(_noop)


def test_unknown_time_zone_names_the_job() -> None:
    with pytest.raises(InvalidJobError, match=r'job "zurich": unknown time zone .*Europe/Zurik'):
        Scheduler().job(cron("0 6 * * *", tz="Europe/Zurik"), id="zurich")(_noop)


def test_duplicate_id_is_refused() -> None:
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="drain")(_noop)
    with pytest.raises(InvalidJobError, match=r'job "drain": id is already registered'):
        scheduler.job(every(minutes=5), id="drain")(_noop)


def test_service_and_job_share_one_id_space() -> None:
    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="poll")(_noop)
    with pytest.raises(InvalidJobError, match="already registered"):
        scheduler.service(id="poll")(_noop)


@pytest.mark.parametrize("period", [{"seconds": 0}, {"minutes": -1}, {}])
def test_zero_or_negative_interval_is_refused(period: dict[str, float]) -> None:
    with pytest.raises(InvalidJobError, match=r'job "tick": interval must be above zero'):
        Scheduler().job(every(**period), id="tick")(_noop)


def test_non_callable_is_refused() -> None:
    with pytest.raises(InvalidJobError, match=r'job "thing": .* is not callable'):
        Scheduler().job(every(minutes=1), id="thing")("not a function")  # type: ignore[type-var]


def test_something_that_is_not_a_trigger_is_refused() -> None:
    with pytest.raises(InvalidJobError, match="use every"):
        Scheduler().job("*/5 * * * *", id="raw")(_noop)  # type: ignore[arg-type]


def test_sync_service_is_refused() -> None:
    def poll(ctx: object) -> None:
        return None

    with pytest.raises(InvalidJobError, match="async def"):
        Scheduler().service(id="poll")(poll)


def test_registration_returns_the_function_unchanged() -> None:
    scheduler = Scheduler()
    assert scheduler.job(every(minutes=1), id="noop", name="No-op")(_noop) is _noop
    assert scheduler.jobs["noop"].name == "No-op"
    assert scheduler.jobs["noop"].is_async
