"""Schedules are namespaced: each name has its own leader key, leader and job rows.
Two Schedulers of one name in one process on one database are refused, whichever role
each DSN logs in as (the duplicate check is keyed on the server's identity)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database
from app.main import create_app
from app.operations.jobs import set_paused
from app.scheduler import (
    DuplicateScheduleError,
    FakeClock,
    InvalidScheduleNameError,
    JobContext,
    Role,
    Scheduler,
    SchedulerConfig,
    every,
)
from app.scheduler.election import LockConnection
from app.scheduler.host_lock import HostLock
from app.scheduler.keys import (
    DEFAULT_SCHEDULE,
    SCHEDULER_LEADER_KEY,
    LeaderKey,
    schedule_hash,
    validate_schedule_name,
)
from app.scheduler.store import JobStore
from app.settings import Settings
from app.testing.server import TestServer

from .conftest import StartScheduler, asyncpg_over_tcp, eventually

_KEY_ROWS = text(
    "SELECT classid::bigint, objid::bigint, objsubid FROM pg_locks"
    " WHERE locktype = 'advisory' AND granted AND pid = :pid"
)


def _scheduler(name: str | None, fired: list[tuple[str, str]], *job_ids: str) -> Scheduler:
    """A scheduler of ``name`` whose jobs (every second) record (name, job id) fired."""
    scheduler = Scheduler(name=name)
    for job_id in job_ids:

        async def body(ctx: JobContext, job_id: str = job_id) -> None:
            fired.append((scheduler.name, job_id))

        scheduler.job(every(seconds=1), id=job_id)(body)
    return scheduler


async def _schedule_rows(engine: AsyncEngine, table: str, column: str) -> set[tuple[str, str]]:
    async with engine.connect() as conn:
        rows = await conn.execute(text(f"SELECT schedule, {column} FROM {table}"))
        return {(row[0], row[1]) for row in rows}


async def test_two_schedule_names_elect_two_leaders_that_each_fire_only_their_own_jobs(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    fired: list[tuple[str, str]] = []
    alpha = _scheduler("alpha", fired, "alpha_job")
    beta = _scheduler("beta", fired, "beta_job")
    leaders = [await start_scheduler(alpha), await start_scheduler(beta)]
    for supervisor in leaders:
        await supervisor.wait_until_firing()
    assert [supervisor.role for supervisor in leaders] == [Role.LEADER, Role.LEADER]

    async def both_fired() -> bool:
        return {("alpha", "alpha_job"), ("beta", "beta_job")} <= set(fired)

    await eventually(both_fired, what="a fire of each schedule's job")
    assert set(fired) == {("alpha", "alpha_job"), ("beta", "beta_job")}
    assert await _schedule_rows(engine, "scheduler_runs", "job_id") == {
        ("alpha", "alpha_job"),
        ("beta", "beta_job"),
    }


async def test_one_job_id_under_two_schedule_names_is_two_jobs(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    fired: list[tuple[str, str]] = []
    for name in ("alpha", "beta"):
        supervisor = await start_scheduler(_scheduler(name, fired, "report"))
        await supervisor.wait_until_firing()

    async def both_fired() -> bool:
        return {("alpha", "report"), ("beta", "report")} <= set(fired)

    await eventually(both_fired, what="a fire of 'report' under each name")
    assert await _schedule_rows(engine, "scheduler_jobs", "id") == {
        ("alpha", "report"),
        ("beta", "report"),
    }


async def test_pausing_a_job_leaves_the_same_job_id_of_another_schedule_alone(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    fired: list[tuple[str, str]] = []
    for name in ("alpha", "beta"):
        supervisor = await start_scheduler(_scheduler(name, fired, "report"))
        await supervisor.wait_until_firing()
    await set_paused(engine, "report", True, schedule="alpha")
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT schedule, paused FROM scheduler_jobs"))
        paused = {row.schedule: row.paused for row in rows}
    assert paused == {"alpha": True, "beta": False}


async def test_the_reaper_of_one_schedule_leaves_another_schedules_leases_alone(
    engine: AsyncEngine,
) -> None:
    fired: list[tuple[str, str]] = []
    now = datetime(2026, 1, 1, tzinfo=UTC)
    stores = {
        name: JobStore(engine, pid=1, host="test", schedule=name) for name in ("alpha", "beta")
    }
    for name, store in stores.items():
        await store.register_leader_jobs(
            _scheduler(name, fired, "report").jobs.values(), now, ZoneInfo("UTC")
        )
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "UPDATE scheduler_jobs SET running_run_id = 1, running_until = :gone,"
                " running_pid = 7, running_host = 'dead', last_status = 'running'"
            ),
            {"gone": now - timedelta(seconds=1)},
        )
    assert await stores["alpha"].reap(now) == ["report"]
    async with engine.connect() as conn:
        rows = await conn.execute(text("SELECT schedule, running_until FROM scheduler_jobs"))
        leases = {row.schedule: row.running_until for row in rows}
    assert leases["alpha"] is None and leases["beta"] is not None


async def test_the_default_schedule_holds_the_legacy_one_bigint_key(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    supervisor = await start_scheduler(_scheduler(None, [], "job"))
    await supervisor.wait_until_firing()
    assert supervisor.lock is not None
    async with engine.connect() as conn:
        keys = (await conn.execute(_KEY_ROWS, {"pid": supervisor.lock.backend_pid})).all()
    assert [tuple(row) for row in keys] == [(0, 911000001, 1)]


async def test_a_named_schedule_holds_the_two_int4_key_of_its_name(
    start_scheduler: StartScheduler, engine: AsyncEngine
) -> None:
    supervisor = await start_scheduler(_scheduler("billing", [], "job"))
    await supervisor.wait_until_firing()
    assert supervisor.lock is not None
    async with engine.connect() as conn:
        keys = (await conn.execute(_KEY_ROWS, {"pid": supervisor.lock.backend_pid})).all()
    objid = schedule_hash("billing") & 0xFFFFFFFF
    assert [tuple(row) for row in keys] == [(SCHEDULER_LEADER_KEY, objid, 2)]


async def test_a_release_before_names_holding_911000001_keeps_the_default_schedule_standing_by(
    start_scheduler: StartScheduler, config: SchedulerConfig
) -> None:
    # What every release before schedule names locks: the bare one-bigint key.
    old_release = await LockConnection.connect(config.lock_dsn, lease_seconds=30)
    try:
        assert await old_release.try_acquire()
        supervisor = await start_scheduler(_scheduler(None, [], "job"))
        await supervisor.wait_for_role(Role.STANDBY)
        await old_release.release()
        await supervisor.wait_for_role(Role.LEADER)
    finally:
        old_release.close()


def _colliding_names() -> tuple[str, str]:
    """Two valid schedule names whose keys hash alike (a birthday search over int4)."""
    seen: dict[int, str] = {}
    index = 0
    while True:
        name = f"s{index}"
        other = seen.setdefault(schedule_hash(name), name)
        if other != name:
            return other, name
        index += 1


async def test_a_schedule_name_whose_key_collides_with_another_name_is_refused_at_start(
    start_scheduler: StartScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = _colliding_names()
    assert LeaderKey.of(first).args == LeaderKey.of(second).args
    leader = await start_scheduler(_scheduler(first, [], "job"))
    await leader.wait_until_firing()
    refused = await start_scheduler(_scheduler(second, [], "job"))
    await refused.wait_for_role(Role.STOPPED)
    assert refused.refusal is not None
    assert repr(first) in refused.refusal and repr(second) in refused.refusal
    assert "rename one" in refused.refusal
    assert any(record.message.startswith("scheduler.refused") for record in caplog.records)
    assert leader.role is Role.LEADER


async def test_a_second_scheduler_of_one_name_in_one_process_is_refused_at_start(
    start_scheduler: StartScheduler,
) -> None:
    first = await start_scheduler(_scheduler("billing", [], "job"), simulated_workers=False)
    await first.wait_until_firing()
    with pytest.raises(DuplicateScheduleError, match=r"'billing'.*Scheduler\(name=") as error:
        await start_scheduler(_scheduler("billing", [], "other"), simulated_workers=False)
    assert error.value.name == "billing"
    other_name = await start_scheduler(_scheduler("reports", [], "job"), simulated_workers=False)
    await other_name.wait_until_firing()


@pytest.fixture
async def leader_without_extra(config: SchedulerConfig) -> AsyncIterator[LockConnection]:
    """A leader of the default schedule, in another app, that fires only job 'shared'."""
    lock = await LockConnection.connect(config.lock_dsn, lease_seconds=30)
    try:
        assert await lock.try_acquire()
        since = datetime.now(UTC)
        term = await lock.record_leadership(
            pid=os.getpid() + 1, host="other-app", since=since, job_ids=["shared"]
        )
        assert term is not None
        yield lock
    finally:
        await lock.release()


async def test_a_standby_logs_once_which_of_its_jobs_its_leader_does_not_fire(
    start_scheduler: StartScheduler,
    leader_without_extra: LockConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="app.scheduler")
    clock = FakeClock()
    supervisor = await start_scheduler(_scheduler(None, [], "shared", "extra"), clock=clock)

    def reports(action: str) -> list[logging.LogRecord]:
        return [record for record in caplog.records if record.message.startswith(action)]

    async def reported() -> bool:
        return bool(reports("scheduler.jobs_not_led"))

    await eventually(reported, what="the standby's report")
    assert supervisor.unled_jobs == ["extra"]
    [report] = reports("scheduler.jobs_not_led")
    assert "extra" in report.message and "shared" not in report.message.split("jobs ")[1]
    for _ in range(3):
        clock.advance(1)
        await clock.wait_for_sleepers()
    assert len(reports("scheduler.jobs_not_led")) == 1
    await leader_without_extra.record_leadership(
        pid=os.getpid() + 1, host="other-app", since=clock.now(), job_ids=["shared", "extra"]
    )

    async def led() -> bool:
        clock.advance(1)
        return bool(reports("scheduler.jobs_led"))

    await eventually(led, what="the report that every job is led again")
    assert supervisor.unled_jobs == []


async def test_health_on_a_standby_whose_leader_lacks_its_job_says_so_with_503(
    settings: Settings, leader_without_extra: LockConnection
) -> None:
    scheduler = _scheduler(None, [], "shared", "extra")
    app = create_app(settings, scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.STANDBY)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/health/scheduler")
    assert response.status_code == 503
    body = response.json()
    assert body["schedule"] == DEFAULT_SCHEDULE and body["leader"] is True
    assert body["jobs_not_led"] == ["extra"]


async def test_a_schedule_name_setting_names_an_unnamed_scheduler(
    settings: Settings, engine: AsyncEngine
) -> None:
    scheduler = _scheduler(None, [], "job")
    app = create_app(settings.model_copy(update={"SCHEDULER_NAME": "billing"}), scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            health = (await client.get("/health/scheduler")).json()
    assert scheduler.name == "billing" and health["schedule"] == "billing"
    assert await _schedule_rows(engine, "scheduler_jobs", "id") == {("billing", "job")}


@given(st.text(max_size=80))
def test_a_schedule_name_is_accepted_exactly_when_it_is_short_and_plain(name: str) -> None:
    plain = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:-")
    expected = 1 <= len(name) <= 63 and set(name) <= plain and name[0] not in "_.:-"
    try:
        validate_schedule_name(name)
    except InvalidScheduleNameError as exc:
        assert not expected
        assert repr(name) in str(exc) and "SCHEDULER_NAME" in str(exc)
    else:
        assert expected


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}", fullmatch=True))
def test_no_schedule_name_but_default_takes_the_legacy_key(name: str) -> None:
    key = LeaderKey.of(name)
    legacy = LeaderKey.of(DEFAULT_SCHEDULE)
    if name == DEFAULT_SCHEDULE:
        assert key == legacy
    else:
        assert key.objsubid == 2 and legacy.objsubid == 1
        assert key.args == (SCHEDULER_LEADER_KEY, schedule_hash(name))


async def test_schedulers_of_one_name_may_stand_for_workers_when_simulated(
    start_scheduler: StartScheduler, config: SchedulerConfig
) -> None:
    assert config.simulated_workers
    supervisors = [await start_scheduler(_scheduler(None, [], "job")) for _ in range(2)]
    roles = await asyncio.gather(
        *(supervisor.wait_for_role(Role.LEADER, Role.STANDBY) for supervisor in supervisors)
    )
    assert sorted(role.value for role in roles) == ["leader", "standby"]


def test_a_bad_schedule_name_is_refused_where_it_is_given(config: SchedulerConfig) -> None:
    with pytest.raises(InvalidScheduleNameError, match="'a b'"):
        replace(config, schedule="a b")
    with pytest.raises(InvalidScheduleNameError, match="''"):
        Scheduler(name="")


def test_each_schedule_name_has_its_own_host_lock_file_and_default_keeps_its_own(
    tmp_path: Path,
) -> None:
    dsn = "postgresql://db/app"
    paths = {
        name: HostLock.for_key(tmp_path, dsn, LeaderKey.of(name).host_lock_id).path
        for name in ("default", "alpha", "beta")
    }
    assert len(set(paths.values())) == 3
    # The file every release before schedule names used for the one key there was.
    assert paths["default"] == HostLock.for_key(tmp_path, dsn, SCHEDULER_LEADER_KEY).path


async def test_a_second_app_of_one_schedule_name_in_one_process_fails_its_start_up(
    settings: Settings,
) -> None:
    first = create_app(settings, _scheduler(None, [], "job"))
    second = create_app(settings, _scheduler(None, [], "job"))
    async with first.router.lifespan_context(first):
        with pytest.raises(DuplicateScheduleError, match="'default'"):
            async with second.router.lifespan_context(second):
                pass


async def test_a_colliding_schedule_name_is_refused_though_the_other_name_holds_its_host_lock(
    start_scheduler: StartScheduler, engine: AsyncEngine, tmp_path: Path
) -> None:
    first, second = _colliding_names()
    leader = await start_scheduler(_scheduler(first, [], "job"), host_lock_dir=tmp_path)
    await leader.wait_until_firing()
    # The leader let go of the host lock; a standby of its name holds it, queued behind it.
    await start_scheduler(_scheduler(first, [], "job"), host_lock_dir=tmp_path)

    async def standby_queued() -> bool:
        async with engine.connect() as conn:
            waiting = await conn.scalar(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
            )
        return bool(waiting == 1)

    await eventually(standby_queued, what="the standby queued")
    refused = await start_scheduler(_scheduler(second, [], "job"), host_lock_dir=tmp_path)
    await refused.wait_for_role(Role.STOPPED)
    assert refused.refusal is not None and repr(first) in refused.refusal


async def test_health_of_a_refused_schedule_name_counts_no_leader_and_gives_the_refusal(
    start_scheduler: StartScheduler, settings: Settings
) -> None:
    first, second = _colliding_names()
    leader = await start_scheduler(_scheduler(first, [], "job"))
    await leader.wait_until_firing()
    scheduler = _scheduler(second, [], "job")
    app = create_app(settings, scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.STOPPED)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/health/scheduler")
    assert response.status_code == 503
    body = response.json()
    assert (body["schedule"], body["leader"], body["firing"]) == (second, False, False)
    assert body["refusal"] == scheduler.supervisor.refusal and repr(first) in body["refusal"]


async def test_a_second_scheduler_of_one_name_is_refused_when_its_dsn_names_the_server_otherwise(
    start_scheduler: StartScheduler, server: TestServer, database_url: str
) -> None:
    if not server.can_restart:
        pytest.skip("spells the local test server's TCP address two ways")
    over_tcp = asyncpg_over_tcp(server, database_url)
    first = await start_scheduler(
        _scheduler("billing", [], "job"), simulated_workers=False, lock_dsn=over_tcp
    )
    await first.wait_until_firing()
    other_spelling = over_tcp.replace("@127.0.0.1:", "@localhost:")
    assert other_spelling != over_tcp
    with pytest.raises(DuplicateScheduleError, match="'billing'"):
        await start_scheduler(
            _scheduler("billing", [], "other"), simulated_workers=False, lock_dsn=other_spelling
        )


@pytest.fixture
async def plain_role_database(database: Database, database_url: str) -> AsyncIterator[Database]:
    """The same database, reached as an ordinary role that may not call
    pg_control_system() (as on hosted servers; the superuser still may)."""
    async with database.engine.begin() as conn:
        await conn.execute(text("DROP ROLE IF EXISTS plain_app_role"))
        await conn.execute(text("CREATE ROLE plain_app_role LOGIN PASSWORD 'plain-pw'"))
        # As on hosted servers that revoke it: this role cannot read the system id.
        await conn.execute(text("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC"))
        await conn.execute(text("GRANT ALL ON SCHEMA public TO plain_app_role"))
        await conn.execute(text("GRANT ALL ON ALL TABLES IN SCHEMA public TO plain_app_role"))
        await conn.execute(text("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO plain_app_role"))
    url = make_url(database_url).set(username="plain_app_role", password="plain-pw")
    other = Database.from_url(url.render_as_string(hide_password=False))
    try:
        yield other
    finally:
        await other.dispose()
        async with database.engine.begin() as conn:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE usename = 'plain_app_role'"
                )
            )
            await conn.execute(text("DROP OWNED BY plain_app_role"))
            await conn.execute(text("DROP ROLE plain_app_role"))


async def test_a_second_scheduler_of_one_name_is_refused_when_its_dsn_logs_in_as_another_role(
    start_scheduler: StartScheduler, plain_role_database: Database
) -> None:
    first = await start_scheduler(_scheduler("billing", [], "job"), simulated_workers=False)
    await first.wait_until_firing()
    second = _scheduler("billing", [], "other")
    try:
        with pytest.raises(DuplicateScheduleError, match="'billing'"):
            await second.start(
                first.config,
                engine=plain_role_database.engine,
                sessions=plain_role_database.sessions,
                sync_sessions=plain_role_database.sync_sessions,
            )
    finally:
        await second.stop()


async def test_health_on_a_standby_whose_leader_lacks_its_service_says_so_with_503(
    settings: Settings, leader_without_extra: LockConnection
) -> None:
    scheduler = _scheduler(None, [], "shared")

    @scheduler.service(id="consumer")
    async def consumer(ctx: object) -> None:
        await asyncio.Event().wait()

    app = create_app(settings, scheduler)
    async with app.router.lifespan_context(app):
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_for_role(Role.STANDBY)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            response = await client.get("/health/scheduler")
    assert response.status_code == 503
    assert response.json()["jobs_not_led"] == ["consumer"]


async def test_a_standby_reports_a_service_its_leader_does_not_run(
    start_scheduler: StartScheduler,
    leader_without_extra: LockConnection,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = _scheduler(None, [], "shared")

    @scheduler.service(id="consumer")
    async def consumer(ctx: object) -> None:
        await asyncio.Event().wait()

    supervisor = await start_scheduler(scheduler, clock=FakeClock())

    async def reported() -> bool:
        return supervisor.unled_jobs == ["consumer"]

    await eventually(reported, what="the standby's report of its unled service")
    [report] = [r for r in caplog.records if r.message.startswith("scheduler.jobs_not_led")]
    assert "consumer" in report.message
