"""Registration fails at once, naming the job, for every declaration mistake."""

import pytest

from app.scheduler import InvalidJobError, JobContext, Scheduler, TriggerArgumentError, cron, every


async def _noop(ctx: JobContext) -> None:
    return None


def test_bad_cron_string_names_the_job_and_the_field() -> None:
    with pytest.raises(
        InvalidJobError, match=r'job "nightly": cron expression .*hour field .*outside 0-23'
    ):
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


@pytest.mark.parametrize("period", [{"seconds": 0}, {}])
def test_zero_interval_is_refused(period: dict[str, float]) -> None:
    with pytest.raises(InvalidJobError, match=r'job "tick": interval must be above zero'):
        Scheduler().job(every(**period), id="tick")(_noop)


@pytest.mark.parametrize(
    "period", [{"minutes": -1}, {"minutes": -1, "seconds": 120}, {"days": 1, "hours": -0.5}]
)
def test_an_interval_with_a_negative_part_is_refused_naming_the_part(
    period: dict[str, float],
) -> None:
    negative = next(unit for unit, value in period.items() if value < 0)
    with pytest.raises(TriggerArgumentError, match=rf"^{negative}=.* not negative"):
        every(**period)


def test_an_interval_whose_parts_add_up_past_ten_years_is_refused() -> None:
    # Each part alone is within ten years; the period, 6,000 days, is not.
    with pytest.raises(TriggerArgumentError, match=r"^period=.*6,000 days is past ten years"):
        every(days=3000, hours=3000 * 24)


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "Factory", "right/UTC"])
def test_a_zone_that_is_the_hosts_own_or_no_place_is_refused_at_registration(zone: str) -> None:
    # localtime is whatever zone each host is set to: two hosts would give one job
    # different slots, as a random field would.
    with pytest.raises(InvalidJobError, match=rf"time zone '{zone}' is not a place"):
        Scheduler().job(cron("0 6 * * *", tz=zone), id="zoned")(_noop)


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


@pytest.mark.parametrize(
    "job_id",
    [
        "nul\x00byte",
        "tab\tid",
        "new\nline",
        "space id",
        "slash/id",
        "ü-umlaut",
        "x" * 201,
        "",
        # A browser resolves a path segment of dots ("%2E%2E" too): no URL reaches it.
        ".",
        "..",
    ],
)
def test_an_id_the_admin_cannot_address_is_refused(job_id: str) -> None:
    with pytest.raises(InvalidJobError, match="id must be"):
        Scheduler().job(every(minutes=1), id=job_id)(_noop)


def test_a_name_with_control_characters_is_refused() -> None:
    with pytest.raises(InvalidJobError, match=r'job "named": name must be'):
        Scheduler().job(every(minutes=1), id="named", name="two\nlines")(_noop)


@pytest.mark.parametrize("expression", ["0 0 30 2 *", "0 0 31 4 *", "0 0 31 2,4,6,9,11 *"])
def test_a_cron_that_is_never_due_is_refused(expression: str) -> None:
    with pytest.raises(InvalidJobError, match="never"):
        Scheduler().job(cron(expression), id="never")(_noop)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), 1e300])
@pytest.mark.parametrize("unit", ["seconds", "minutes", "hours", "days"])
def test_an_interval_that_is_not_a_finite_sane_number_is_refused(unit: str, value: float) -> None:
    with pytest.raises((InvalidJobError, ValueError), match="every"):
        Scheduler().job(every(**{unit: value}), id="tick")(_noop)


@pytest.mark.parametrize("option", ["first_run", "timeout", "jitter", "misfire_grace"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 1e300])
def test_an_option_that_is_not_a_finite_sane_number_is_refused(option: str, value: float) -> None:
    with pytest.raises(InvalidJobError, match=rf'job "opt": {option} must be'):
        Scheduler().job(every(minutes=1), id="opt", **{option: value})(_noop)  # type: ignore[arg-type]


def test_an_async_generator_is_refused() -> None:
    async def generate(ctx: JobContext):  # type: ignore[no-untyped-def]
        yield None

    with pytest.raises(InvalidJobError, match="async generator"):
        Scheduler().job(every(minutes=1), id="gen")(generate)


def test_an_object_with_an_async_call_runs_on_the_loop() -> None:
    class Job:
        async def __call__(self, ctx: JobContext) -> None:
            return None

    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="callable")(Job())
    assert scheduler.jobs["callable"].is_async


@pytest.mark.parametrize("grace", [0, 0.5])
def test_a_misfire_grace_below_a_second_is_refused_naming_none(grace: float) -> None:
    # Every fire wakes a few milliseconds after its slot: such a grace misses them all.
    with pytest.raises(InvalidJobError, match=r'job "strict": misfire_grace .* use None'):
        Scheduler().job(every(seconds=1), id="strict", misfire_grace=grace)(_noop)


@pytest.mark.parametrize(
    ("trigger", "jitter"),
    [(every(minutes=1), 60), (every(minutes=1), 180), (cron("0 6,7 * * *"), 3600)],
)
def test_a_jitter_as_long_as_the_shortest_gap_is_refused(trigger: object, jitter: float) -> None:
    # A fire jittered past the next slot would coalesce that slot away, unrecorded.
    with pytest.raises(InvalidJobError, match=r"jitter .* shorter than the shortest gap"):
        Scheduler().job(trigger, id="wide", jitter=jitter)(_noop)  # type: ignore[arg-type]


def test_a_jitter_shorter_than_the_shortest_gap_is_accepted() -> None:
    scheduler = Scheduler()
    scheduler.job(cron("0 6,7 * * *"), id="narrow", jitter=3599)(_noop)
    assert scheduler.jobs["narrow"].jitter == 3599


@pytest.mark.parametrize(
    "func",
    [lambda: None, lambda ctx, extra: None, lambda *, ctx: None],
    ids=["no-parameter", "two-parameters", "keyword-only"],
)
def test_a_function_that_cannot_take_the_context_is_refused(func: object) -> None:
    with pytest.raises(InvalidJobError, match=r'job "shape": .* cannot be called with'):
        Scheduler().job(every(minutes=1), id="shape")(func)  # type: ignore[type-var]


def test_a_function_with_defaults_after_the_context_is_accepted() -> None:
    def job(ctx: JobContext, retries: int = 3) -> None:
        return None

    scheduler = Scheduler()
    scheduler.job(every(minutes=1), id="defaults")(job)
    assert "defaults" in scheduler.jobs
