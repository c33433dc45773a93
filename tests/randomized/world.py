"""Plays a Scenario: real supervisors, runner and outbox on one FakeClock and a real
PostgreSQL, and the guarantees checked after every step.

Each node is a Scheduler with its own lock connection, as a uvicorn worker would be;
they share the process, the clock, the recorder and the fake receiver. After a step the
world *settles*: it waits (polling the database, never sleeping for a fixed time) until
every due slot is claimed, one node leads and no run row is left 'running' without a
body; when nothing moves it nudges the clock a tick at a time, as time would pass. A
world that does not settle has a stuck job, and that is a failure like any other.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import asyncpg
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.db import Database, asyncpg_dsn
from app.operations.errors import AdminError
from app.operations.jobs import run_job_now, set_paused
from app.operations.leadership import leader
from app.operations.messages import reset_outbox_message
from app.outbox import DrainReport
from app.scheduler import FakeClock, JobContext, Role, Scheduler, SchedulerConfig, Trigger, every
from app.scheduler.keys import SCHEDULER_LEADER_KEY
from app.testing import TestServer

from .effects import CountingOutbox, Receiver, Recorder
from .plans import JobPlan, Scenario, Step

__all__ = ["World", "open_world"]

OUTBOX = "soak"
SERVICE = "soak_consumer"
MAX_NODES = 3
TICK = 1.0
# Real seconds a hanging receiver holds a delivery; in fake time it sets the lease.
DELIVERY_TIMEOUT = 5.0
# Waiting for the world to settle: how long nothing may change before the clock moves
# a tick, how many ticks, and the real-time bound after which the world is stuck.
_QUIET_SECONDS = 0.1
_MAX_NUDGES = 60
_SETTLE_TIMEOUT = 20.0
# A running lease's length (config.lease_seconds, fake seconds: the lease clock is the
# world's clock); its owner renews it every third of it. While a lease is held, time
# passes in steps of at most _TIME_STEP, each one taken only when every lease a node
# renews outlasts it: a lease that would not has a renewal due (it was taken or renewed
# more than a period ago), so the world waits for that renewal to land first.
_LEASE_SECONDS = 300
_TIME_STEP = _LEASE_SECONDS / 6
# A hung delivery holds its drain this long in real time.
_STILL_STUCK_SECONDS = DELIVERY_TIMEOUT + 1
_HEAL_ROUNDS = 12
_RAN = ("running", "ok", "error", "timeout", "cancelled")
_UTC = ZoneInfo("UTC")
# A failure report carries the last records of the engine's log and of the world's own
# (each step played), so that a failure seen once is never lost with the run's output.
_LOGGER = logging.getLogger("tests.randomized")
_TAIL_RECORDS = 400
_TAIL_LOGGERS = ("app", _LOGGER.name)
# Run rows in a failure report: the most recent ones, most jobs' whole history.
_REPORTED_RUNS = 60
_REPORTED_CHARS = 160
# Who holds the leader key, by the server's word: the test's own reading of pg_locks.
_HOLDERS = (
    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = 0 AND objsubid = 1"
    " AND objid = :key AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


class _Tail(logging.Handler):
    """The last _TAIL_RECORDS records of the engine's and the world's loggers, each
    stamped with the fake time it was emitted at (the records' own time is the host's)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(logging.INFO)
        self.clock = clock
        self.lines: collections.deque[str] = collections.deque(maxlen=_TAIL_RECORDS)
        self._levels: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record as one line (its traceback's last line, if any)."""
        line = f"{self.clock.now().isoformat()} {record.levelname} {record.name}: "
        line += record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += f" [{exc.__class__.__name__}: {exc}]"
        self.lines.append(line)

    @contextlib.contextmanager
    def attached(self) -> Iterator[None]:
        """Receive INFO and above of _TAIL_LOGGERS while the block runs."""
        for name in _TAIL_LOGGERS:
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            if logger.getEffectiveLevel() > logging.INFO:
                logger.setLevel(logging.INFO)
            logger.addHandler(self)
        try:
            yield
        finally:
            for name, level in self._levels.items():
                logging.getLogger(name).removeHandler(self)
                logging.getLogger(name).setLevel(level)


class Node:
    """One worker: a Scheduler with the scenario's jobs, a service and the outbox."""

    def __init__(self, world: World, label: str) -> None:
        self.world = world
        self.label = label
        self.scheduler = Scheduler()
        self.running = False
        for plan in world.scenario.jobs:
            self._add_job(plan)
        self.scheduler.service(id=SERVICE)(self._service)
        self.outbox = CountingOutbox(
            OUTBOX,
            world.receiver,
            tally=world.reported,
            scheduler=self.scheduler,
            batch_size=world.scenario.outbox.batch_size,
            concurrency=world.scenario.outbox.concurrency,
            delivery_timeout=DELIVERY_TIMEOUT,
            max_attempts=5,
            backoff=(5, 15, 60),
        )
        self.outbox.bind(world.db.engine, listen_dsn=world.config.lock_dsn, clock=world.clock)

    @property
    def role(self) -> Role:
        """The node's scheduler role."""
        return self.scheduler.role

    async def start(self) -> None:
        """Start the node's supervisor."""
        self.running = True
        db = self.world.db
        await self.scheduler.start(
            self.world.config,
            engine=db.engine,
            sessions=db.sessions,
            sync_sessions=db.sync_sessions,
            clock=self.world.clock,
        )

    async def is_firing(self) -> bool:
        """True once the node leads with its job rows registered and its loops running."""
        supervisor = self.scheduler.supervisor
        if supervisor is None:
            return False
        try:
            await supervisor.wait_until_firing(timeout=0)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Stop it gracefully (the shutdown grace, then unlock)."""
        self.running = False
        await self.scheduler.stop()

    def _add_job(self, plan: JobPlan) -> None:
        world, node = self.world, self.label

        def started(ctx: JobContext) -> None:
            world.recorder.body_started(
                plan.id,
                ctx.scheduled_at,
                node,
                world.leading_nodes(),
                world.firing_nodes(),
                world.describe_nodes(),
            )

        if plan.thread:

            def thread_body(ctx: JobContext) -> None:
                started(ctx)
                completed = False
                try:
                    completed = world.wait_in_thread(plan.duration)
                finally:
                    world.recorder.body_ended(plan.id, ctx.scheduled_at, node, completed=completed)

            body: Callable[[JobContext], object] = thread_body
        else:

            async def async_body(ctx: JobContext) -> None:
                started(ctx)
                completed = False
                try:
                    if plan.duration:
                        await ctx.clock.sleep(plan.duration)
                    completed = True
                finally:
                    world.recorder.body_ended(plan.id, ctx.scheduled_at, node, completed=completed)

            body = async_body
        self.scheduler.job(
            plan.trigger(),
            id=plan.id,
            jitter=plan.jitter or None,
            misfire_grace=plan.misfire_grace,
            first_run=plan.first_run,
        )(body)

    def describe(self) -> str:
        """The node's role, whether it fires, its lock connection and the runs whose
        lease it renews, as a failure report shows them."""
        supervisor = self.scheduler.supervisor
        if supervisor is None:
            return f"{self.label}: {self.role.value}"
        said = f"{self.label}: {self.role.value}, firing {supervisor.firing}"
        said += f", renewing {sorted(supervisor.runner.renewing)}"
        lock = supervisor.lock
        if lock is None:
            return said
        closed = lock._connection.is_closed()  # a report, never a decision
        return f"{said}, on backend {lock.backend_pid} (closed {closed})"

    async def _service(self, ctx: object) -> None:
        self.world.recorder.service_started(self.label, self.world.describe_nodes())
        try:
            await asyncio.Event().wait()
        finally:
            self.world.recorder.service_stopped(self.label)


@dataclass
class World:
    """The nodes, clock, database and records of one scenario run."""

    scenario: Scenario
    server: TestServer | None
    database_url: str
    db: Database
    clock: FakeClock
    config: SchedulerConfig
    recorder: Recorder = field(default_factory=Recorder)
    reported: DrainReport = field(default_factory=DrainReport)
    nodes: list[Node] = field(default_factory=list)
    # Run-now requests that were each a request of their own (not one merged into a
    # request still pending), and those a pause dropped before the leader took them.
    run_now_requests: dict[str, set[datetime]] = field(default_factory=dict)
    run_now_dropped: dict[str, set[datetime]] = field(default_factory=dict)
    keys: list[str] = field(default_factory=list)
    faults: int = 0
    steps: int = 0
    _time_moved: threading.Condition = field(default_factory=threading.Condition)
    _released: bool = False
    _foreign: asyncpg.Connection | None = None
    receiver: Receiver = field(init=False)
    _tail: _Tail = field(init=False)

    def __post_init__(self) -> None:
        self.receiver = Receiver(self.clock, self.config.lock_dsn, self.recorder)
        self._tail = _Tail(self.clock)

    @property
    def triggers(self) -> dict[str, Trigger]:
        """Every leader job's trigger, the outbox drain's included."""
        found: dict[str, Trigger] = {plan.id: plan.trigger() for plan in self.scenario.jobs}
        return found | {f"outbox_{OUTBOX}_drain": every(minutes=1)}

    def jitter(self, job_id: str) -> float:
        """The planned jitter of a job (0 for the drain)."""
        return next((plan.jitter for plan in self.scenario.jobs if plan.id == job_id), 0.0)

    def running_nodes(self) -> list[Node]:
        """Nodes started and not stopped."""
        return [node for node in self.nodes if node.running]

    def describe_nodes(self) -> str:
        """Every node as a failure report shows it (Node.describe)."""
        return "; ".join(node.describe() for node in self.nodes)

    def leading_nodes(self) -> list[str]:
        """Labels of the nodes whose role is to fire: leading (from promotion to the
        end of stepping down), or unguarded."""
        return [node.label for node in self.nodes if node.role in (Role.LEADER, Role.UNGUARDED)]

    def firing_nodes(self) -> list[str]:
        """Labels of the nodes that fire right now: their job loops run (a promoted
        node in its handover grace does not fire yet, one stepping down no longer)."""
        return [
            node.label
            for node in self.nodes
            if node.scheduler.supervisor is not None and node.scheduler.supervisor.firing
        ]

    def advance(self, seconds: float) -> None:
        """Move the clock, and wake the thread bodies waiting on it."""
        self.clock.advance(seconds)
        with self._time_moved:
            self._time_moved.notify_all()

    async def pass_time(self, seconds: float) -> None:
        """Let ``seconds`` pass as they pass for live processes, not as a freeze of all
        of them: while a running lease is held, a step of at most _TIME_STEP at a time,
        each taken once every lease a node renews outlasts it (the renewals that came
        due landed). A jump is the fault that freezes everything at once. The outbox's
        real-time work ends before each step."""
        left = seconds
        while left > 0:
            step = min(left, _TIME_STEP) if await self._leases_held() else left
            await self._leases_outlast(step)
            # Last: no await lies between a quiet outbox and the clock's move (nor,
            # after the last step, the step's action).
            await self._quiesce()
            self.advance(step)
            left -= step

    def wait_in_thread(self, seconds: float) -> bool:
        """Block a worker thread for ``seconds`` of fake time; False when the run ends
        first and releases it."""
        until = self.clock.now() + timedelta(seconds=seconds)
        with self._time_moved:
            self._time_moved.wait_for(lambda: self._released or self.clock.now() >= until, 120)
        return self.clock.now() >= until

    async def add_node(self) -> None:
        """Start one more worker."""
        node = Node(self, f"node{len(self.nodes)}")
        self.nodes.append(node)
        await node.start()

    # Steps ----------------------------------------------------------------------------

    async def play(self, step: Step) -> None:
        """Advance the clock, do the step's action, settle, and check every guarantee."""
        self.steps += 1
        self.faults += step.is_fault
        _LOGGER.info("soak.step %s: %s", self.steps - 1, step)
        await self.pass_time(step.advance)
        await getattr(self, f"_do_{step.action}")(step)
        await self.settle()
        await self.check()

    async def _do_tick(self, step: Step) -> None:
        return None

    async def _do_jump(self, step: Step) -> None:
        self.advance(float(step.detail[0]))

    async def _do_terminate_leader(self, step: Step) -> None:
        for node in self.running_nodes():
            supervisor = node.scheduler.supervisor
            if node.role is Role.LEADER and supervisor is not None and supervisor.lock:
                await self._execute(
                    "SELECT pg_terminate_backend(:pid)", pid=supervisor.lock.backend_pid
                )

    async def _do_stop(self, step: Step) -> None:
        running = self.running_nodes()
        if running:
            await running[step.target % len(running)].stop()

    async def _do_start(self, step: Step) -> None:
        if len(self.running_nodes()) < MAX_NODES:
            await self.add_node()

    async def _do_pause(self, step: Step) -> None:
        job = self._job(step)
        with contextlib.suppress(AdminError):
            await set_paused(self.db.engine, job, True)
            # The pause dropped every request the leader had not taken by then.
            ran = await self._manual_slots(job)
            pending = self.run_now_requests.get(job, set()) - ran
            self.run_now_dropped.setdefault(job, set()).update(pending)

    async def _do_resume(self, step: Step) -> None:
        with contextlib.suppress(AdminError):
            await set_paused(self.db.engine, self._job(step), False)

    async def _do_run_now(self, step: Step) -> None:
        # An operator's click never lands in the very microsecond a slot was claimed.
        self.advance(0.001)
        job, now = self._job(step), self.clock.now()
        with contextlib.suppress(AdminError):
            await run_job_now(self.db.engine, job, lease_now=now)
            # Its own request is pending or was taken (with its run row, in one commit);
            # else it was merged into one still pending when it was asked.
            rows = await self._fetch(
                "SELECT run_requested_at FROM scheduler_jobs WHERE id = :job", job=job
            )
            if rows[0].run_requested_at == now or now in await self._manual_slots(job):
                self.run_now_requests.setdefault(job, set()).add(now)

    async def _manual_slots(self, job: str) -> set[datetime]:
        rows = await self._fetch(
            "SELECT slot FROM scheduler_runs WHERE job_id = :job AND manual", job=job
        )
        return {row.slot for row in rows}

    async def _do_enqueue(self, step: Step) -> None:
        outbox = self.nodes[0].outbox
        async with self.db.sessions() as session, session.begin():
            for behaviour in step.detail:
                key = f"k{len(self.keys)}"
                self.keys.append(key)
                self.receiver.behaviours[key] = behaviour
                await outbox.enqueue(session, {"key": key}, key=key)

    async def _do_reset(self, step: Step) -> None:
        ids = [row.id for row in await self._fetch("SELECT id FROM outbox_messages ORDER BY id")]
        if ids:
            with contextlib.suppress(AdminError):
                await reset_outbox_message(
                    self.db.engine, OUTBOX, ids[step.target % len(ids)], self.clock.now()
                )

    async def _do_lock_timeout(self, step: Step) -> None:
        name = make_url(self.database_url).database
        await self._execute(f"ALTER DATABASE \"{name}\" SET lock_timeout = '200ms'")

    async def _do_foreign_lock(self, step: Step) -> None:
        if self._foreign is None:
            self._foreign = await asyncpg.connect(self.config.lock_dsn)
            await self._foreign.execute("SELECT pg_advisory_lock(7, $1)", SCHEDULER_LEADER_KEY)

    async def _do_restart_server(self, step: Step) -> None:
        if self.server is None:
            return  # TEST_DATABASE_URL's server is not ours to restart
        # On this thread, not a worker thread: the postmaster dies with the thread that
        # started it (parent-death signal), and asyncio.run ends its worker threads.
        # The loop stands still meanwhile, as a frozen process would; the lease is longer.
        self.server.restart()
        if self._foreign is not None:
            self._foreign.terminate()
            self._foreign = None

    def _job(self, step: Step) -> str:
        return self.scenario.jobs[step.target % len(self.scenario.jobs)].id

    # Settling -------------------------------------------------------------------------

    async def settle(self) -> None:
        """Wait until the world is at rest; nudge the clock a tick when nothing moves.

        Raises AssertionError naming what never came to rest (a stuck job)."""
        started = last_nudge = time.monotonic()
        nudges = 0
        while True:
            reasons = await self._unsettled()
            # Work under way in real time (a receiver answering, an outcome being
            # written, a lease renewal that came due) ends by itself; the clock stands
            # still meanwhile, as it would. Asked last, so that no await lies between
            # this answer and a nudge.
            busy = await self._leases_short_of(TICK) + await self._in_flight()
            reasons += busy
            if not reasons:
                return
            now = time.monotonic()
            if now - started > _SETTLE_TIMEOUT or (
                nudges == _MAX_NUDGES and now - last_nudge > _STILL_STUCK_SECONDS
            ):
                raise AssertionError(
                    f"stuck after {nudges} tick(s) at {self.clock.now().isoformat()}: {reasons}"
                )
            if busy:
                last_nudge = now
            elif now - last_nudge > _QUIET_SECONDS and nudges < _MAX_NUDGES:
                self.advance(TICK)
                nudges += 1
                last_nudge = now
            await asyncio.sleep(0.02)

    async def _leases_outlast(self, seconds: float) -> None:
        """Return once every live body's running lease outlasts ``seconds`` from now.
        Raises AssertionError naming a lease whose renewal never landed."""
        started = time.monotonic()
        while short := await self._leases_short_of(seconds):
            if time.monotonic() - started > _SETTLE_TIMEOUT:
                raise AssertionError(
                    f"running leases never renewed: {short} ({self.describe_nodes()})"
                )
            await asyncio.sleep(0.02)

    async def _leases_held(self) -> bool:
        """True while a job row holds a running lease (a run claimed, maybe not yet
        started: its body, and its renewals, begin a moment after the claim)."""
        try:
            rows = await self._fetch(
                "SELECT count(*) AS n FROM scheduler_jobs WHERE running_until IS NOT NULL"
            )
        except Exception:
            return True  # unknown: take small steps
        return bool(rows[0].n)

    async def _leases_short_of(self, seconds: float) -> list[str]:
        """The running leases a node renews that end within ``seconds``: each has a
        renewal due (it was renewed, or taken, more than a period ago)."""
        renewing = {
            run_id
            for node in self.nodes
            if node.scheduler.supervisor is not None
            for run_id in node.scheduler.supervisor.runner.renewing
        }
        if not renewing:
            return []
        try:
            # The lease lives on the run row (the job row's copy may lag behind it).
            rows = await self._fetch(
                "SELECT j.id, j.running_run_id,"
                " GREATEST(j.running_until, r.running_until) AS running_until"
                " FROM scheduler_jobs j LEFT JOIN scheduler_runs r ON r.id = j.running_run_id"
                " WHERE j.running_until IS NOT NULL"
            )
        except Exception:
            return []  # the server is away: nothing renews, nothing reaps
        horizon = self.clock.now() + timedelta(seconds=seconds)
        return [
            f"{row.id} (run {row.running_run_id}) leased until {row.running_until.isoformat()}"
            for row in rows
            if row.running_until <= horizon and row.running_run_id in renewing
        ]

    async def _quiesce(self) -> None:
        """Return once no outbox work goes on in real time, so that the clock can move
        (settle and check may have let a drain start meanwhile).

        Raises AssertionError naming the work that never ended."""
        started = time.monotonic()
        while busy := await self._in_flight():
            if time.monotonic() - started > _SETTLE_TIMEOUT:
                raise AssertionError(f"still busy at {self.clock.now().isoformat()}: {busy}")
            await asyncio.sleep(0.02)

    async def _in_flight(self) -> list[str]:
        """The outbox work going on in real time (see Receiver.in_flight). The claims
        are read again when a call ended during the read: a read that began before that
        call's row was claimed would hide its outcome, still to be written."""
        while True:
            ends = self.receiver.ends
            held: dict[int, Any] = {}
            if self.receiver.ended:
                with contextlib.suppress(Exception):
                    rows = await self._fetch(
                        "SELECT id, claimed_by FROM outbox_messages WHERE outbox = :o"
                    )
                    held = {row.id: row.claimed_by for row in rows}
            if self.receiver.ends == ends:
                return self.receiver.in_flight(held)

    async def _unsettled(self) -> list[str]:
        running = self.running_nodes()
        if not running:
            return []
        reasons: list[str] = []
        if not [node for node in running if await node.is_firing()]:
            reasons.append("nobody fires")
        leaders = [node.label for node in running if node.role is Role.LEADER]
        if len(leaders) > 1:
            reasons.append(f"{leaders} all lead")
        try:
            holders = {row.pid for row in await self._fetch(_HOLDERS, key=SCHEDULER_LEADER_KEY)}
            jobs = await self._fetch(
                "SELECT id, next_run_at, paused, run_requested_at FROM scheduler_jobs"
            )
            running_rows = await self._fetch(
                "SELECT job_id, slot, id FROM scheduler_runs"
                " WHERE scope = 'leader' AND status = 'running'"
            )
        except Exception as exc:
            return [*reasons, f"database: {exc.__class__.__name__}"]
        for node in running:
            lock = node.scheduler.supervisor.lock if node.scheduler.supervisor else None
            if node.role is Role.LEADER and lock is not None and lock.backend_pid not in holders:
                reasons.append(
                    f"{node.label} leads on backend {lock.backend_pid}, which has no key"
                )
        now = self.clock.now()
        stored = {row.id: row for row in jobs}
        for job_id in self.triggers:
            row = stored.get(job_id)
            if row is None:
                reasons.append(f"{job_id} has no row")
            elif not row.paused and row.next_run_at + timedelta(seconds=self.jitter(job_id)) <= now:
                reasons.append(f"{job_id} due since {row.next_run_at.isoformat()}")
            elif not row.paused and row.run_requested_at is not None:
                reasons.append(f"{job_id} run-now pending since {row.run_requested_at.isoformat()}")
        draining = any(node.outbox.passes for node in self.nodes)
        if draining and self.receiver.healed:
            reasons.append("a drain pass is under way")
        for row in running_rows:
            if row.job_id == f"outbox_{OUTBOX}_drain":
                body_runs = draining
            else:
                body_runs = self.recorder.is_running(row.job_id, row.slot)
            if row.job_id in self.triggers and not body_runs:
                ran = self.recorder.starts[(row.job_id, row.slot)]
                reasons.append(
                    f"run {row.id} of {row.job_id} (slot {row.slot.isoformat()}) is 'running' "
                    f"with no body running; its body started {ran} time(s)"
                )
        return reasons

    # Guarantees -----------------------------------------------------------------------

    async def check(self) -> None:
        """Raise AssertionError listing every guarantee broken so far."""
        problems = list(self.recorder.violations)
        problems += await self._schedule_problems()
        problems += await self._leader_problems()
        problems += await self._outbox_problems()
        assert not problems, "\n".join(problems)

    async def _schedule_problems(self) -> list[str]:
        problems: list[str] = []
        # Bodies start only after their claim commits: read them before the database,
        # so that every body seen has its run row in what the query returns.
        starts, completed = self.recorder.snapshot()
        # One snapshot for both: a claim may commit between two reads (a job whose
        # jitter for this slot is below the plan's is claimed while the world counts
        # it not yet due), and its moved next_run_at without its run row would read as
        # a slot skipped with no record.
        runs, job_rows = await self._fetch_consistent(
            "SELECT job_id, slot, status, manual FROM scheduler_runs WHERE scope = 'leader'"
            " ORDER BY job_id, slot",
            "SELECT * FROM scheduler_jobs",
        )
        jobs = {row.id: row for row in job_rows}
        statuses: dict[tuple[str, datetime], str] = {}
        by_job: dict[str, list[datetime]] = {}
        manual: dict[str, set[datetime]] = {}
        for row in runs:
            statuses[(row.job_id, row.slot)] = row.status
            if row.manual:
                manual.setdefault(row.job_id, set()).add(row.slot)
            else:
                by_job.setdefault(row.job_id, []).append(row.slot)
        for job_id in self.triggers:
            problems += self._run_now_problems(job_id, manual.get(job_id, set()), jobs.get(job_id))
        for job_id, trigger in self.triggers.items():
            # Scheduled slots only: a run-now is a run of its own, beside the schedule.
            slots = by_job.get(job_id, [])
            for before, after in itertools.pairwise(slots):
                allowed = trigger.next_after(before, _UTC)
                if after < allowed:
                    problems.append(
                        f"{job_id} fired slot {after.isoformat()} after {before.isoformat()}: "
                        f"its schedule allows {allowed.isoformat()} at the earliest"
                    )
            if slots and job_id in jobs:
                latest = trigger.next_after(slots[-1], _UTC)
                if jobs[job_id].next_run_at > latest:
                    problems.append(
                        f"{job_id} skipped slots with no record: next_run_at "
                        f"{jobs[job_id].next_run_at.isoformat()}, last slot {slots[-1].isoformat()}"
                    )
        for (job_id, slot), count in starts.items():
            if statuses.get((job_id, slot)) not in _RAN:
                recorded = sorted(s.isoformat() for j, s in statuses if j == job_id)
                problems.append(
                    f"{job_id} ran slot {slot.isoformat()} {count} time(s) but its run row says "
                    f"{statuses.get((job_id, slot))} (recorded slots: {recorded})"
                )
        thread_jobs = {plan.id for plan in self.scenario.jobs if plan.thread}
        for job_id, slot in completed:
            if job_id in thread_jobs and statuses.get((job_id, slot)) == "cancelled":
                problems.append(
                    f"{job_id} slot {slot.isoformat()}: its thread finished, the run says cancelled"
                )
        return problems

    def _run_now_problems(self, job_id: str, manual: set[datetime], row: Any) -> list[str]:
        """A manual run only for a request, and every request run unless it is still
        pending or a pause dropped it."""
        requests = self.run_now_requests.get(job_id, set())
        pending = row.run_requested_at if row is not None else None
        problems = [
            f"{job_id} has a manual run of {slot.isoformat()}, which no run-now asked for"
            for slot in sorted(manual - requests)
        ]
        lost = requests - manual - self.run_now_dropped.get(job_id, set()) - {pending}
        problems += [
            f"{job_id}: the run-now asked at {moment.isoformat()} never ran"
            f" (run_requested_at {pending})"
            for moment in sorted(lost)
        ]
        return problems

    async def _leader_problems(self) -> list[str]:
        leaders = [node for node in self.running_nodes() if node.role is Role.LEADER]
        if len(leaders) != 1 or leaders[0].scheduler.supervisor is None:
            return []
        lock = leaders[0].scheduler.supervisor.lock
        if lock is None:
            return []
        shown = await leader(self.db.engine)
        if shown["backend_pid"] != lock.backend_pid:
            return [
                f"the admin view names backend {shown['backend_pid']} as leader; "
                f"{leaders[0].label} leads on backend {lock.backend_pid}"
            ]
        return []

    async def _outbox_problems(self) -> list[str]:
        rows = await self._fetch("SELECT key, status FROM outbox_messages WHERE outbox = :o")
        return [
            f"outbox key {row.key} is marked delivered but the receiver never accepted it"
            for row in rows
            if row.status == "delivered" and not self.receiver.accepted.get(row.key)
        ]

    async def finish(self) -> None:
        """Heal the receiver and let time pass until every row is delivered or stuck;
        then no key may be lost or delivered twice, and the drains' reported counts
        must match what the database accepted."""
        if not self.running_nodes():
            await self.add_node()
        for plan in self.scenario.jobs:
            with contextlib.suppress(AdminError):
                await set_paused(self.db.engine, plan.id, False)
        self.receiver.healed = True
        await self.settle()
        for _ in range(_HEAL_ROUNDS):
            pending = (
                await self._fetch(
                    "SELECT count(*) AS n, min(next_attempt_at) AS due FROM outbox_messages"
                    " WHERE status = 'pending'"
                )
            )[0]
            if not pending.n:
                break
            wait = (pending.due - self.clock.now()).total_seconds() if pending.due else 0
            await self.pass_time(max(wait, 0) + 61)
            await self.settle()
            await self.check()
        rows = await self._fetch("SELECT * FROM outbox_messages WHERE outbox = :o")
        problems = [
            f"outbox key {row.key} still pending after healing at {self.clock.now().isoformat()}: "
            f"attempts {row.attempts}, next attempt {row.next_attempt_at.isoformat()}, "
            f"claimed by {row.claimed_by}, receiver calls {self.receiver.calls[row.key]}"
            for row in rows
            if row.status == "pending"
        ]
        for row in rows:
            accepted = len(self.receiver.accepted.get(row.key, []))
            if row.status == "stuck" and accepted:
                problems.append(
                    f"outbox key {row.key} is stuck but was delivered {accepted} time(s)"
                )
        delivered = sum(row.status == "delivered" for row in rows)
        # A drain cancelled mid-pass (its worker stopped leading) reports nothing, so
        # the reports may fall short of the database; they may never exceed it.
        if self.reported.delivered > delivered:
            problems.append(
                f"drains reported {self.reported.delivered} delivered; the database has {delivered}"
            )
        assert not problems, "\n".join(problems)

    # Evidence -------------------------------------------------------------------------

    async def evidence(self) -> str:
        """What a failure report shows beside the broken guarantee: the fake time, the
        steps played, every node, what the recorder holds, the scheduler's and the
        outbox's rows as the database has them now, and the log's last records."""
        starts, completed = self.recorder.snapshot()
        lines = [
            f"at {self.clock.now().isoformat()}, after {self.steps} step(s) of "
            f"{len(self.scenario.steps)}",
            f"scenario: {self.scenario}",
            f"nodes: {self.describe_nodes()}",
            f"bodies running: {dict(self.recorder.active)}; services on {self.recorder.services}",
            "bodies started (job, slot: count): "
            + ", ".join(f"{j} {s.isoformat()}: {n}" for (j, s), n in sorted(starts.items())),
            "bodies completed: " + ", ".join(f"{j} {s.isoformat()}" for j, s in sorted(completed)),
            f"run-now requests: {self.run_now_requests}; dropped by a pause: "
            f"{self.run_now_dropped}",
        ]
        for title, sql in (
            ("scheduler_jobs", "SELECT * FROM scheduler_jobs ORDER BY id"),
            (
                f"scheduler_runs (the last {_REPORTED_RUNS})",
                "SELECT * FROM (SELECT * FROM scheduler_runs ORDER BY id DESC"
                f" LIMIT {_REPORTED_RUNS}) last ORDER BY id",
            ),
            ("outbox_messages", "SELECT * FROM outbox_messages ORDER BY id"),
        ):
            lines.append(f"{title}:")
            try:
                rows = await self._fetch(sql)
            except Exception as exc:
                lines.append(f"  (unread: {exc.__class__.__name__}: {exc})")
                continue
            lines += [f"  {_row_text(row)}" for row in rows]
        lines.append(f"the log's last {len(self._tail.lines)} records:")
        lines += [f"  {line}" for line in self._tail.lines]
        return "\n".join(lines)

    # Database -------------------------------------------------------------------------

    async def _fetch(self, sql: str, **params: object) -> list[Any]:
        async with self.db.engine.connect() as conn:
            return list(await conn.execute(text(sql), {"o": OUTBOX} | params))

    async def _fetch_consistent(self, *sqls: str) -> list[list[Any]]:
        """The rows of each query, all read in one snapshot (repeatable read)."""
        async with self.db.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="REPEATABLE READ")
            async with conn.begin():
                return [list(await conn.execute(text(sql), {"o": OUTBOX})) for sql in sqls]

    async def _execute(self, sql: str, **params: object) -> None:
        async with self.db.engine.begin() as conn:
            await conn.execute(text(sql), params)

    async def close(self) -> None:
        """Release waiting threads, stop every node, wait for the bodies that outlived
        their node (and their outcomes) as the app's lifespan does, then close what the
        world opened: a pool connection checked out across dispose() would go back to
        the disposed pool, which nothing closes."""
        with self._time_moved:
            self._released = True
            self._time_moved.notify_all()
        await asyncio.gather(*(node.stop() for node in self.nodes if node.running))
        await asyncio.gather(*(node.scheduler.wait_for_threads() for node in self.nodes))
        if self._foreign is not None:
            self._foreign.terminate()
        await self.receiver.close()
        await self.db.dispose()


@contextlib.asynccontextmanager
async def open_world(
    scenario: Scenario, database_url: str, server: TestServer | None
) -> AsyncIterator[World]:
    """A world with the scenario's first nodes started; closed (every node stopped) on
    exit, whatever happened. An exception out of the block carries the world's
    evidence (World.evidence) as a note, which its traceback prints."""
    config = SchedulerConfig(
        lock_dsn=asyncpg_dsn(database_url),
        # Real seconds on the server (idle_session_timeout): long enough that a slow
        # step on a loaded machine never drops a lock connection by itself. Fake
        # seconds for a running lease: longer than a step's advance and its nudges, so
        # that a claim still under way when time passes keeps a live lease.
        lease_seconds=_LEASE_SECONDS,
        leader_tick_seconds=TICK,
        handover_grace_seconds=TICK,
        shutdown_grace_seconds=0.2,
        # Every node of the world is a worker of one schedule, in this process.
        simulated_workers=True,
    )
    world = World(
        scenario,
        server,
        database_url,
        Database.from_url(database_url),
        FakeClock(datetime(2026, 3, 27, 23, 0, tzinfo=ZoneInfo("UTC"))),
        config,
    )
    with world._tail.attached():
        try:
            for _ in range(scenario.supervisors):
                await world.add_node()
            await world.settle()
            yield world
        except Exception as exc:
            # Read before close() stops the nodes: the state that broke the guarantee.
            exc.add_note(await world.evidence())
            raise
        finally:
            await world.close()


def _row_text(row: Any) -> str:
    """A database row as ``column=value`` pairs, each value cut to _REPORTED_CHARS."""
    pairs = []
    for column, value in row._mapping.items():
        shown = value.isoformat() if isinstance(value, datetime) else repr(value)
        if len(shown) > _REPORTED_CHARS:
            shown = shown[:_REPORTED_CHARS] + "..."
        pairs.append(f"{column}={shown}")
    return ", ".join(pairs)
