"""Fixtures: a real PostgreSQL, a fresh migrated database per test, engines, settings."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import asyncpg
import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import Database, asyncpg_dsn
from app.localpg import free_port
from app.scheduler import (
    Clock,
    FakeClock,
    JobContext,
    Scheduler,
    SchedulerConfig,
    SystemClock,
    Trigger,
    every,
)
from app.scheduler.election import LockConnection
from app.scheduler.keys import DEFAULT_SCHEDULE, LeaderKey
from app.scheduler.supervisor import Supervisor
from app.settings import Settings, load_settings
from app.testing import TestServer


def pytest_collection_finish(session: pytest.Session) -> None:
    """Leave what every test shares (modules, the collected tests) out of the collections
    after each test: a full collection then walks only what tests made since, not the
    whole heap (0.3 s a test otherwise, a quarter of the parallel lane's time)."""
    gc.freeze()


@pytest.fixture(autouse=True)
def _collect_what_the_test_left() -> Iterator[None]:
    """Collect what a test left behind, before the next one starts.

    Outboxes are registered per process by name: a dropped test's outboxes leave
    Outbox.live(), so the next test may reuse a name and its app sees only its own; and
    a dropped test's engines and connections are finalized here, not in the middle of a
    later test."""
    yield
    gc.collect()


pytest_plugins = ["app.testing.plugin"]

# The lanes of the README's test command: these markers' tests run after the others,
# two at a time (the others run on four worker processes). Their bounds ("another process
# fires within 3 s", a server back within its restart) are what they test, measured on
# the wall clock, and real processes' start-ups are CPU the first lane, which keeps both
# cores busy, would take from them. Two at a time leave them CPU to spare: four runs of
# the lane alone at -n 2 took 2 min 45 s (3 min 12 s beside another run), every bound
# held; one at a time it took 4 min 31 s.
_REAL_PROCESSES_LANE = ("multiprocess", "restarts_server")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test of the real-processes lane ``real_processes`` before ``-m``
    selects a lane."""
    for item in items:
        if any(item.get_closest_marker(name) for name in _REAL_PROCESSES_LANE):
            item.add_marker(pytest.mark.real_processes)


@pytest.fixture(scope="session")
def pg_server(regent_server: TestServer) -> TestServer:
    """The session's PostgreSQL server: the shipped test kit's."""
    return regent_server


@pytest.fixture
def server(pg_server: TestServer) -> TestServer:
    """The server, for fault tests that restart or crash it (skipped on an external one)."""
    if not pg_server.can_restart:
        pytest.skip("TEST_DATABASE_URL is set: this test must restart the server")
    return pg_server


@pytest.fixture
def database_url(regent_database_url: str) -> str:
    """URL of a fresh database at head, dropped after the test (the kit's)."""
    return regent_database_url


@pytest.fixture
def empty_database_url(pg_server: TestServer) -> Iterator[str]:
    """URL of a fresh database with no schema at all."""
    url = pg_server.create_database(migrated=False)
    try:
        yield url
    finally:
        pg_server.drop_database(url)


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Test settings bound to this test's database, ignoring any .env file. Without the
    retention job (tests/retention turns it on), so a test's app has only its own jobs."""
    return load_settings(
        _env_file=None,
        DATABASE_URL=database_url,
        ENVIRONMENT="test",
        RETENTION_ENABLED=False,
        LEASE_SECONDS=6,
        LEADER_TICK_SECONDS=1,
        HANDOVER_GRACE_SECONDS=0,
        SHUTDOWN_GRACE_SECONDS=2,
    )


@pytest.fixture
def database(regent_database: Database) -> Database:
    """Engines and session factories on this test's database (the kit's)."""
    return regent_database


@pytest.fixture
def engine(database: Database) -> AsyncEngine:
    """The async engine of this test's database."""
    return database.engine


class StartScheduler(Protocol):
    def __call__(
        self, scheduler: Scheduler, *, clock: Clock | None = None, **overrides: Any
    ) -> Awaitable[Supervisor]: ...


@pytest.fixture
def config(database_url: str) -> SchedulerConfig:
    """Fast timings for tests: 6 s lease, 1 s tick, no handover grace; several
    Schedulers of one name in this process stand for several workers."""
    return SchedulerConfig(
        lock_dsn=asyncpg_dsn(database_url),
        lease_seconds=6,
        leader_tick_seconds=1,
        handover_grace_seconds=0,
        shutdown_grace_seconds=2,
        simulated_workers=True,
        # The default, pinned: the prepared-claim tests depend on it.
        claim_ahead_seconds=0.5,
    )


class SkewedClock(SystemClock):
    """A host's real clock set ``skew`` off the other hosts' (and the database's)."""

    def __init__(self, skew: timedelta) -> None:
        self.skew = skew

    def now(self) -> datetime:
        return super().now() + self.skew


@pytest.fixture(params=[timedelta(minutes=2), timedelta(minutes=-2)], ids=["ahead", "behind"])
def skewed_clock(request: pytest.FixtureRequest) -> SkewedClock:
    """A host's real clock two minutes ahead of the database's, or two behind: further
    off than any lease (the outbox's row lease is 60 s by default, the tests' running
    lease 6 s)."""
    skew: timedelta = request.param
    return SkewedClock(skew)


async def set_on_the_database(
    engine: AsyncEngine, database_url: str, setting: str, value: str
) -> None:
    """A database default every new session inherits (the pool is emptied for it)."""
    name = make_url(database_url).database
    async with engine.begin() as conn:
        await conn.execute(text(f"ALTER DATABASE \"{name}\" SET {setting} = '{value}'"))
    await engine.dispose()


@pytest.fixture(params=["none", "lock_timeout", "statement_timeout"])
async def database_timeout(
    request: pytest.FixtureRequest, engine: AsyncEngine, database_url: str
) -> str:
    """The timeout every app session of the test's database inherits: none (PostgreSQL's
    default, under which a statement waits on a held row for as long as it is held), or
    a DBA's short lock_timeout or statement_timeout (200 ms). Returns which."""
    if request.param != "none":
        await set_on_the_database(engine, database_url, request.param, "200ms")
    async with engine.connect() as conn:
        shown = {
            setting: (await conn.execute(text(f"SHOW {setting}"))).scalar_one()
            for setting in ("lock_timeout", "statement_timeout")
        }
    expected = {"lock_timeout": "0", "statement_timeout": "0"}
    if request.param != "none":
        expected[request.param] = "200ms"
    assert shown == expected, shown
    return str(request.param)


@pytest.fixture
def fake_clock() -> FakeClock:
    """A clock that moves only when the test says so."""
    return FakeClock()


@pytest.fixture
async def start_scheduler(
    database: Database, config: SchedulerConfig
) -> AsyncIterator[StartScheduler]:
    """Start a Scheduler's supervisor in this process; every one is stopped at teardown."""
    started: list[Scheduler] = []

    async def start(
        scheduler: Scheduler, *, clock: Clock | None = None, **overrides: Any
    ) -> Supervisor:
        started.append(scheduler)
        return await scheduler.start(
            replace(config, **overrides),
            engine=database.engine,
            sessions=database.sessions,
            sync_sessions=database.sync_sessions,
            clock=clock,
        )

    yield start
    await asyncio.gather(*(scheduler.stop() for scheduler in started))
    # As the app's lifespan does before it disposes the engine: the work that outlived
    # the stop (a thread, a carried statement) ends on this loop, not after it closed.
    await asyncio.gather(*(scheduler.wait_for_threads() for scheduler in started))


@pytest.fixture
async def leader_key_backend(database_url: str) -> AsyncIterator[int]:
    """The backend pid of a connection that holds the default schedule's leader key
    (a leader's lock connection, for takes fenced by it; a frozen leader, which fires
    nothing), until the test ends."""
    holder = await asyncpg.connect(asyncpg_dsn(database_url))
    try:
        key = LeaderKey.of(DEFAULT_SCHEDULE)
        await holder.execute(key.call("pg_advisory_lock"), *key.args)
        yield int(await holder.fetchval("SELECT pg_backend_pid()"))
    finally:
        await holder.close()


# When a promotion elsewhere says it began: only operators read it.
_SINCE = datetime(2026, 1, 1, tzinfo=UTC)


async def promote_elsewhere(database_url: str) -> int:
    """A promotion on a lock connection of its own: take the free leader key, record the
    leadership (which moves the term, as every promotion does), let go. Returns the new
    term."""
    lock = await LockConnection.connect(asyncpg_dsn(database_url), lease_seconds=30)
    try:
        assert await lock.try_acquire(), "another session holds the leader key"
        term = await lock.record_leadership(pid=os.getpid(), host="elsewhere", since=_SINCE)
        assert term is not None, "the promotion's record did not match: key not held"
        return term
    finally:
        await lock.release()


async def _ends_ok(ctx: JobContext) -> None:
    return None


def release(*job_ids: str, trigger: Trigger | None = None) -> Scheduler:
    """The Scheduler of a release of an app that registers ``job_ids``, each on
    ``trigger`` (default hourly) with a body that ends ok at once: two releases, one
    without a job, make it retired."""
    scheduler = Scheduler()
    for job_id in job_ids:
        scheduler.job(trigger or every(hours=1), id=job_id)(_ends_ok)
    return scheduler


# A user's app of the README's shape: create_app() at import, settings read from the
# environment, a route of its own.
USER_APP = """
from app.main import create_app
from app.scheduler import JobContext, Scheduler, every

scheduler = Scheduler()


@scheduler.job(every(hours=1), id="user_job")
async def user_job(ctx: JobContext) -> None:
    return None


app = create_app(scheduler=scheduler)


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"from": "mypkg"}
"""


@dataclass(frozen=True)
class ServedUserApp:
    """A served USER_APP: its HTTP port, and the file its stderr goes to."""

    http_port: int
    log: Path

    def get(self, path: str) -> httpx.Response:
        """GET ``path`` of the served app."""
        return httpx.get(f"http://127.0.0.1:{self.http_port}{path}")


class ServeUserApp(Protocol):
    def __call__(self, *, workers: int) -> ServedUserApp: ...


@pytest.fixture
def serve_user_app() -> Iterator[ServeUserApp]:
    """Serve USER_APP as package ``mypkg`` with `python -m app --app mypkg.main:app
    --workers N` on the embedded database (no DATABASE_URL), returning once its own
    route answers; every one is stopped and its files removed at teardown."""
    started: list[tuple[subprocess.Popen[bytes], Path]] = []

    def serve(*, workers: int) -> ServedUserApp:
        # Not pytest's tmp_path: as root the server runs as another user, who must reach it.
        tmp_path = Path(tempfile.mkdtemp(prefix="regent-user-app-"))
        (tmp_path / "mypkg").mkdir()
        (tmp_path / "mypkg" / "__init__.py").write_text("")
        (tmp_path / "mypkg" / "main.py").write_text(USER_APP)
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        tmp_path.chmod(0o755)
        data_dir.chmod(0o755)
        served = ServedUserApp(free_port(), tmp_path / "stderr.txt")
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        env |= {
            "REGENT_DATA_DIR": str(data_dir),
            "REGENT_PG_PORT": str(free_port()),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
        }
        command = ["--app", "mypkg.main:app", "--workers", str(workers)]
        with served.log.open("w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "app", *command, "--port", str(served.http_port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        started.append((process, tmp_path))
        # Start-up is not what these tests bound (see test_cli's embedded_app).
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"python -m app exited: {served.log.read_text()[-600:]}"
            try:
                if served.get("/hello").status_code == 200:
                    return served
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the user's app did not answer"
            time.sleep(0.1)

    yield serve
    for process, tmp_path in started:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        subprocess.run(["rm", "-rf", str(tmp_path)], check=False)


_HIDDEN = re.compile(r'<input type="hidden" name="([^"]+)" value="([^"]*)">')


async def admin_sign_in(
    client: httpx.AsyncClient, token: str, root_path: str = ""
) -> httpx.Response:
    """Post ``token`` through the admin's sign-in form (served under ``root_path``) as a
    browser does: read the form (which sets its cookie), post its hidden fields with the
    token; the answer."""
    form = (await client.get(f"{root_path}/admin")).text
    return await client.post(f"{root_path}/admin/login", data=sign_in_fields(form, token))


def sign_in_fields(form: str, token: str) -> dict[str, str]:
    """What the sign-in form ``form`` (its HTML) posts with ``token`` typed in."""
    return dict(_HIDDEN.findall(form)) | {"token": token}


async def admin_session(client: httpx.AsyncClient, token: str, root_path: str = "") -> str:
    """Sign in with the right ``token`` (admin_sign_in); the base of the session's page,
    ``/admin/s/<sid>`` (no trailing slash: its main screen is the base plus "/"), which
    the session cookie ``client`` now holds is sent to."""
    signed_in = await admin_sign_in(client, token, root_path)
    assert signed_in.status_code == 303, signed_in.text
    return signed_in.headers["location"].removesuffix("/")


@pytest.fixture
def project_with_its_own_app(tmp_path: Path) -> Path:
    """A user's project in FastAPI's "Bigger Applications" layout: a top-level package
    ``app`` of its own, whose ``app/main.py`` builds its app with Regent's
    ``create_app``, imported through the ``regent`` name."""
    project = tmp_path / "project"
    (project / "app").mkdir(parents=True)
    (project / "app" / "__init__.py").write_text("")
    (project / "app" / "main.py").write_text(
        "from regent import create_app\n\napp = create_app()\n"
    )
    return project


@pytest.fixture
def project_with_its_own_namespace_app(project_with_its_own_app: Path) -> Path:
    """The same project whose ``app/`` has no ``__init__.py`` (a namespace package, which
    Python finds only after every regular ``app``, Regent's included)."""
    (project_with_its_own_app / "app" / "__init__.py").unlink()
    return project_with_its_own_app


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A directory (mode 0755) the embedded server's account can pass through: as root
    the server runs as another user, who cannot enter pytest's directories."""
    path = Path(tempfile.mkdtemp(prefix="regent-sec-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def user_project(tmp_path: Path) -> Path:
    """An empty directory for a user's project (no migrations of its own yet)."""
    project = tmp_path / "project"
    project.mkdir()
    return project


async def statement_waits_on_a_lock(engine: AsyncEngine, statement: str) -> bool:
    """Whether a session of this test's database waits on a lock in a statement whose
    text contains ``statement`` (a claim, a renewal, a take held up by a held row)."""
    async with engine.connect() as conn:
        waiting = await conn.execute(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database() AND strpos(query, :statement) > 0"
            ),
            {"statement": statement},
        )
        return bool(waiting.scalar_one())
