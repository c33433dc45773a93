"""Two Schedulers of one name in one process on one database are refused, whichever
role each DSN logs in as (the duplicate check is keyed on the server's identity)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from app.db import Database
from app.scheduler import DuplicateScheduleError, JobContext, Scheduler, every

from ..scheduler.conftest import StartScheduler


def _scheduler(job_id: str) -> Scheduler:
    scheduler = Scheduler(name="billing")

    async def body(ctx: JobContext) -> None:
        return None

    scheduler.job(every(hours=1), id=job_id)(body)
    return scheduler


@pytest.fixture
async def plain_role_database(database: Database, database_url: str) -> AsyncIterator[Database]:
    """The same database, reached as an ordinary role that may not call
    pg_control_system() (as on hosted servers; the superuser still may)."""
    async with database.engine.begin() as conn:
        await conn.execute(text("DROP ROLE IF EXISTS adv_app_role"))
        await conn.execute(text("CREATE ROLE adv_app_role LOGIN PASSWORD 'adv-pw'"))
        # As on hosted servers that revoke it: this role cannot read the system id.
        await conn.execute(text("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC"))
        await conn.execute(text("GRANT ALL ON SCHEMA public TO adv_app_role"))
        await conn.execute(text("GRANT ALL ON ALL TABLES IN SCHEMA public TO adv_app_role"))
        await conn.execute(text("GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO adv_app_role"))
    url = make_url(database_url).set(username="adv_app_role", password="adv-pw")
    other = Database.from_url(url.render_as_string(hide_password=False))
    try:
        yield other
    finally:
        await other.dispose()
        async with database.engine.begin() as conn:
            await conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE usename = 'adv_app_role'"
                )
            )
            await conn.execute(text("DROP OWNED BY adv_app_role"))
            await conn.execute(text("DROP ROLE adv_app_role"))


async def test_a_second_scheduler_of_one_name_is_refused_when_its_dsn_logs_in_as_another_role(
    start_scheduler: StartScheduler, plain_role_database: Database
) -> None:
    first = await start_scheduler(_scheduler("job"), simulated_workers=False)
    await first.wait_until_firing()
    second = _scheduler("other")
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
