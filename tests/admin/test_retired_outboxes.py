"""An outbox no app drains any more (its drain job retired, or gone from a schedule
that claimed it) on the operator's surfaces: hidden from the default listing, shown
when asked, and forgotten (its rows deleted) only then."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from zoneinfo import ZoneInfo

import httpx
import pytest
from sqlalchemy import text

from app.db import Database
from app.outbox import Message, Outbox, drain_job_id
from app.scheduler import JobContext, Scheduler, SystemClock, every
from app.scheduler.store import JobStore

from .conftest import AUTH, Serve, app_command, execute, signed_in, stuck_row


async def _noop(ctx: JobContext) -> None:
    return None


async def _deliver(message: Message) -> None:
    return None


@asynccontextmanager
async def _draining_mail(serve: Serve, database: Database) -> AsyncIterator[httpx.AsyncClient]:
    """The admin of a release whose app drains outbox 'mail' (and not 'grants'), once
    its leader fires (its promotion has settled which jobs are retired); 'mail' has a
    stuck row."""
    scheduler = Scheduler()
    Outbox("mail", _deliver, scheduler=scheduler)
    async with serve(scheduler) as client:
        assert scheduler.supervisor is not None
        await scheduler.supervisor.wait_until_firing()
        await stuck_row(database, 3, outbox="mail")
        yield client


@pytest.fixture
async def grants_of_an_older_release(database: Database) -> None:
    """An older release drained outbox 'grants' (its drain job registered, the name
    claimed for schedule 'default'), which has a stuck row and a delivered one."""
    older = Scheduler()
    older.job(every(minutes=1), id=drain_job_id("grants"))(_noop)
    rows = JobStore(database.engine, pid=0, host="previous-release")
    await rows.register_leader_jobs(older.jobs.values(), SystemClock().now(), ZoneInfo("UTC"))
    await execute(
        database, "INSERT INTO outbox_schedules (outbox, schedule) VALUES ('grants', 'default')"
    )
    await execute(
        database,
        "INSERT INTO outbox_drains (outbox, last_drain_at, delivered, retried, stuck)"
        " VALUES ('grants', now(), 1, 0, 1)",
    )
    await stuck_row(database, 1)
    await execute(
        database,
        "INSERT INTO outbox_messages (id, outbox, key, payload, status, attempts,"
        " next_attempt_at, created_at, updated_at) OVERRIDING SYSTEM VALUE"
        " VALUES (2, 'grants', 'k-2', '{}', 'delivered', 1, now(), now(), now())",
    )


async def _listed(client: httpx.AsyncClient, query: str = "") -> dict[str, bool]:
    listed = (await client.get(f"/admin/api/outboxes{query}", headers=AUTH)).json()
    return {entry["name"]: entry["retired"] for entry in listed}


async def _rows_of(database: Database, outbox: str) -> int:
    async with database.engine.connect() as conn:
        query = text(
            "SELECT (SELECT count(*) FROM outbox_messages WHERE outbox = :o)"
            " + (SELECT count(*) FROM outbox_drains WHERE outbox = :o)"
            " + (SELECT count(*) FROM outbox_schedules WHERE outbox = :o)"
        )
        count: int = (await conn.execute(query, {"o": outbox})).scalar_one()
    return count


@pytest.mark.usefixtures("grants_of_an_older_release")
async def test_an_outbox_whose_drain_job_is_retired_is_listed_only_when_asked_for(
    serve: Serve, database: Database
) -> None:
    async with _draining_mail(serve, database) as client:
        assert await _listed(client) == {"mail": False}
        assert await _listed(client, "?retired=true") == {"grants": True, "mail": False}


@pytest.mark.usefixtures("grants_of_an_older_release")
async def test_an_outbox_whose_drain_job_was_forgotten_is_retired(
    serve: Serve, database: Database
) -> None:
    async with _draining_mail(serve, database) as client:
        forgot = await client.delete(f"/admin/api/jobs/{drain_job_id('grants')}", headers=AUTH)
        assert forgot.status_code == 200, forgot.text
        assert await _listed(client, "?retired=true") == {"grants": True, "mail": False}


@pytest.mark.usefixtures("grants_of_an_older_release")
async def test_the_cli_lists_a_retired_outbox_only_with_all(
    serve: Serve, database: Database, database_url: str
) -> None:
    async with _draining_mail(serve, database):
        default = await asyncio.to_thread(app_command, database_url, "outbox", "list")
        everything = await asyncio.to_thread(app_command, database_url, "outbox", "list", "--all")
    assert default.returncode == 0, default.stderr
    assert "grants" not in default.stdout and "mail" in default.stdout
    [grants] = [line for line in everything.stdout.splitlines() if line.startswith("grants")]
    assert "retired" in grants


@pytest.mark.usefixtures("grants_of_an_older_release")
async def test_forgetting_a_retired_outbox_deletes_its_rows_and_says_how_many(
    serve: Serve, database: Database, database_url: str
) -> None:
    async with _draining_mail(serve, database):
        result = await asyncio.to_thread(app_command, database_url, "outbox", "forget", "grants")
    assert result.returncode == 0, result.stderr
    assert "forgot outbox 'grants' and its 2 message(s)" in result.stdout
    assert await _rows_of(database, "grants") == 0


@pytest.mark.usefixtures("grants_of_an_older_release")
async def test_forgetting_a_retired_outbox_prints_json_for_scripts(
    serve: Serve, database: Database, database_url: str
) -> None:
    async with _draining_mail(serve, database):
        result = await asyncio.to_thread(
            app_command, database_url, "outbox", "forget", "grants", "--json"
        )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "status": "forgotten",
        "outbox": "grants",
        "messages_deleted": 2,
    }


@pytest.mark.usefixtures("grants_of_an_older_release")
async def test_forgetting_an_outbox_an_app_drains_is_refused_saying_why(
    serve: Serve, database: Database, database_url: str
) -> None:
    async with _draining_mail(serve, database) as client:
        refused = await client.delete("/admin/api/outboxes/mail", headers=AUTH)
        cli = await asyncio.to_thread(app_command, database_url, "outbox", "forget", "mail")
    assert refused.status_code == 409
    assert "drains it" in refused.json()["detail"]
    assert cli.returncode == 1 and "drains it" in cli.stderr
    async with database.engine.connect() as conn:
        query = text("SELECT id FROM outbox_messages WHERE outbox = 'mail'")
        assert (await conn.execute(query)).scalars().all() == [3]


@pytest.mark.usefixtures("grants_of_an_older_release")
async def test_the_page_shows_a_retired_outbox_apart_and_forgets_it_with_its_csrf(
    serve: Serve, database: Database
) -> None:
    async with _draining_mail(serve, database) as client:
        base, csrf = await signed_in(client)
        page = (await client.get(f"{base}/")).text
        outboxes = page[
            page.index('<table id="outboxes"') : page.index(
                "</table>", page.index('<table id="outboxes"')
            )
        ]
        assert 'data-outbox="grants"' not in outboxes
        assert 'id="retired-outboxes"' in page
        assert f'action="{base}/outboxes/grants/forget"' in page
        refused = await client.post(f"{base}/outboxes/grants/forget", data={"csrf": "x"})
        assert refused.status_code == 403
        answer = await client.post(
            f"{base}/outboxes/grants/forget", data={"csrf": csrf}, follow_redirects=True
        )
    assert answer.status_code == 200
    assert "Outbox grants is forgotten" in answer.text
    assert await _rows_of(database, "grants") == 0
