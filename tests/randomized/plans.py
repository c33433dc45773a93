"""What a randomized run does, as plain data: the job set, the outbox, and the steps.

Hypothesis draws a Scenario; its repr is the step sequence a failure report quotes.
Nothing here touches the database: world.py plays a Scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from app.scheduler import Trigger, cron, every

__all__ = ["ACTIONS", "JobPlan", "OutboxPlan", "Scenario", "Step", "scenarios"]

# Zones with a 30-minute DST shift, a 45-minute offset, no DST, and the usual ones.
ZONES = (
    "UTC",
    "Europe/Zurich",
    "America/New_York",
    "Australia/Lord_Howe",
    "Pacific/Chatham",
    "Asia/Kolkata",
)
CRONS = ("*/5 * * * *", "0 * * * *", "*/30 * * * *", "0 */2 * * *", "30 2 * * *", "15 6 * * 1")
INTERVALS = (10, 30, 60, 300, 900, 3600)
# A receiver's behaviour for one key: answers at once, after that many (fake) seconds,
# fails that many times first, refuses for good (stuck), or never answers (the
# delivery timeout ends it).
BEHAVIOURS = ("fast", "slow:20", "slow:90", "fail:2", "permanent", "hang")

# Step actions. Every step first moves the clock by ``advance`` seconds (time passes
# between any two events), then acts.
ACTIONS = (
    "tick",  # nothing else
    "jump",  # a long jump: hours to weeks
    "terminate_leader",  # pg_terminate_backend of the leader's lock connection
    "stop",  # graceful stop of one supervisor
    "start",  # one more supervisor (a new process), up to three
    "pause",
    "resume",
    "run_now",
    "enqueue",  # rows for the outbox, each with a receiver behaviour
    "reset",  # an operator resets an outbox row (any status)
    "lock_timeout",  # the database gets a lock_timeout (a role or database setting)
    "foreign_lock",  # another application holds a two-key advisory lock
    "restart_server",  # PostgreSQL restarts (soak profile only: slow)
)
_FAULTS = {"jump", "terminate_leader", "stop", "lock_timeout", "foreign_lock", "restart_server"}


@dataclass(frozen=True)
class JobPlan:
    """One leader-only job: its trigger, body and options. ``duration`` is how many
    fake seconds the body takes (longer than the period makes it overlap itself)."""

    id: str
    interval: int | None
    expression: str | None
    tz: str | None
    thread: bool
    duration: float
    jitter: float
    misfire_grace: float | None
    first_run: float | None

    def trigger(self) -> Trigger:
        """The job's trigger."""
        if self.interval is not None:
            return every(seconds=self.interval)
        assert self.expression is not None
        return cron(self.expression, tz=self.tz)


@dataclass(frozen=True)
class OutboxPlan:
    """The outbox's batch and concurrency (small values make rows wait at the gate)."""

    batch_size: int
    concurrency: int


@dataclass(frozen=True)
class Step:
    """Advance the clock by ``advance`` seconds, then do ``action``. ``target`` picks a
    job, supervisor or row (modulo how many there are); ``detail`` is the jump length
    in seconds or the receiver behaviours of enqueued rows."""

    action: str
    advance: float
    target: int = 0
    detail: tuple[str, ...] = ()

    @property
    def is_fault(self) -> bool:
        """True for the steps that break something (as opposed to operator actions)."""
        return self.action in _FAULTS


@dataclass(frozen=True)
class Scenario:
    """A whole randomized run."""

    jobs: tuple[JobPlan, ...]
    outbox: OutboxPlan
    supervisors: int
    steps: tuple[Step, ...]


@st.composite
def _job(draw: st.DrawFn, index: int) -> JobPlan:
    interval = draw(st.one_of(st.none(), st.sampled_from(INTERVALS)))
    expression = tz = None
    if interval is None:
        expression = draw(st.sampled_from(CRONS))
        tz = draw(st.sampled_from(ZONES))
    return JobPlan(
        id=f"job{index}",
        interval=interval,
        expression=expression,
        tz=tz,
        thread=draw(st.booleans()),
        duration=draw(st.sampled_from((0.0, 0.0, 5.0, 45.0, 700.0))),
        jitter=draw(st.sampled_from((0.0, 0.0, 3.0, 8.0))),
        misfire_grace=draw(st.sampled_from((None, None, 5.0, 60.0, 3600.0))),
        first_run=draw(st.sampled_from((None, None, 0.0, 5.0))),
    )


_DETAIL_BY_ACTION = {
    # Up to 28 days: past the 24.8 days of lateness an int4 of milliseconds holds.
    "jump": st.sampled_from((3_600, 6 * 3_600, 86_400, 7 * 86_400, 21 * 86_400, 28 * 86_400)).map(
        lambda seconds: (str(seconds),)
    ),
    "enqueue": st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=4).map(tuple),
}


@st.composite
def _step(draw: st.DrawFn, actions: tuple[str, ...]) -> Step:
    action = draw(st.sampled_from(actions))
    detail = draw(_DETAIL_BY_ACTION[action]) if action in _DETAIL_BY_ACTION else ()
    return Step(
        action=action,
        advance=draw(st.sampled_from((0.5, 1.0, 4.0, 11.0, 35.0, 61.0, 95.0))),
        target=draw(st.integers(0, 5)),
        detail=detail,
    )


def scenarios(*, min_steps: int, max_steps: int, restarts: bool) -> st.SearchStrategy[Scenario]:
    """Scenarios of 1-4 jobs, 1-3 supervisors and ``min_steps`` to ``max_steps`` steps;
    server restarts only when ``restarts``. Shrinking never goes below ``min_steps``."""
    actions = ACTIONS if restarts else tuple(a for a in ACTIONS if a != "restart_server")

    @st.composite
    def build(draw: st.DrawFn) -> Scenario:
        count = draw(st.integers(1, 4))
        return Scenario(
            jobs=tuple(draw(_job(index)) for index in range(count)),
            outbox=OutboxPlan(
                batch_size=draw(st.sampled_from((1, 3, 50))),
                concurrency=draw(st.sampled_from((1, 2, 10))),
            ),
            supervisors=draw(st.integers(1, 3)),
            steps=tuple(draw(st.lists(_step(actions), min_size=min_steps, max_size=max_steps))),
        )

    return build()
