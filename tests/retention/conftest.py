"""Retention fixtures: history written straight into the tables, aged on the database's
clock, and what of it is left."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.db import Database
from app.settings import Settings

_JOB = text(
    "INSERT INTO scheduler_jobs (schedule, id, name, trigger, next_run_at)"
    " VALUES (:schedule, :job_id, :job_id, 'every 60s', now() + interval '1 hour')"
    " ON CONFLICT DO NOTHING"
)
_RUN = text(
    "INSERT INTO scheduler_runs (schedule, job_id, scope, slot, started_at, finished_at,"
    " status, lateness_ms, pid, host)"
    " SELECT :schedule, :job_id, 'leader', t, t, CASE WHEN :status = 'running' THEN NULL"
    " ELSE t END, :status, 0, 1, 'h'"
    " FROM (SELECT now() - make_interval(secs => CAST(:age AS double precision)) AS t) s"
    " RETURNING id"
)
_MESSAGE = text(
    "INSERT INTO outbox_messages (outbox, key, payload, status, attempts, next_attempt_at,"
    " created_at, updated_at, delivered_at)"
    " SELECT :outbox, :key, '{}', :status, 1, t, t, t,"
    " CASE WHEN :status = 'delivered' THEN t END"
    " FROM (SELECT now() - make_interval(secs => CAST(:age AS double precision)) AS t) s"
    " RETURNING id"
)
_CLAIM_NAME = text(
    "INSERT INTO outbox_schedules (outbox, schedule) VALUES (:outbox, :schedule)"
    " ON CONFLICT DO NOTHING"
)

DAY = 86400.0


class History:
    """Writes runs and outbox rows of a given age (seconds before the database's now)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def run(
        self, job_id: str, age: float, *, status: str = "ok", schedule: str = "default"
    ) -> int:
        """A run of ``job_id`` started ``age`` seconds ago; its id."""
        async with self.engine.begin() as conn:
            await conn.execute(_JOB, {"schedule": schedule, "job_id": job_id})
            params = {"schedule": schedule, "job_id": job_id, "status": status, "age": age}
            run_id: int = (await conn.execute(_RUN, params)).scalar_one()
        return run_id

    async def message(self, outbox: str, key: str, age: float, *, status: str = "delivered") -> int:
        """A row of ``outbox`` written (and, when delivered, delivered) ``age`` seconds
        ago, its outbox drained by the ``default`` schedule; its id."""
        async with self.engine.begin() as conn:
            await conn.execute(_CLAIM_NAME, {"outbox": outbox, "schedule": "default"})
            params = {"outbox": outbox, "key": key, "status": status, "age": age}
            message_id: int = (await conn.execute(_MESSAGE, params)).scalar_one()
        return message_id

    async def run_ids(self, job_id: str | None = None) -> set[int]:
        """The ids of the runs left (of ``job_id``, or all)."""
        query = (
            "SELECT id FROM scheduler_runs WHERE CAST(:job_id AS text) IS NULL OR job_id = :job_id"
        )
        async with self.engine.connect() as conn:
            return set((await conn.execute(text(query), {"job_id": job_id})).scalars())

    async def message_ids(self) -> set[int]:
        """The ids of the outbox rows left."""
        async with self.engine.connect() as conn:
            return set((await conn.execute(text("SELECT id FROM outbox_messages"))).scalars())


@pytest.fixture
def history(database: Database) -> History:
    """History written into this test's database."""
    return History(database.engine)


@pytest.fixture
async def session(database: Database) -> AsyncIterator[AsyncSession]:
    """A session with no transaction open, as a job's ``ctx.session`` is."""
    async with database.sessions() as session:
        yield session


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The test settings with retention on, as every app has it by default."""
    return settings.model_copy(update={"RETENTION_ENABLED": True})
