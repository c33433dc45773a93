"""The after-response contract: committed first, plain values only, failures logged."""

import logging

import pytest
from fastapi import BackgroundTasks
from sqlalchemy import text

from app.after_response import AfterResponseError, run_after_response
from app.db import Database


async def _noop(*args: object) -> None:
    return None


async def test_task_added_inside_an_open_transaction_is_refused(database: Database) -> None:
    async with database.sessions() as session, session.begin():
        await session.execute(text("SELECT 1"))
        with pytest.raises(AfterResponseError, match="commit"):
            run_after_response(BackgroundTasks(), session, _noop, 1)


async def test_orm_like_objects_are_refused_by_name(database: Database) -> None:
    async with database.sessions() as session:
        with pytest.raises(AfterResponseError, match=r"argument 'grant' is a Database"):
            run_after_response(BackgroundTasks(), session, _noop, grant=database)


async def test_a_failing_task_is_logged_not_raised(
    database: Database, caplog: pytest.LogCaptureFixture
) -> None:
    async def explode(grant_id: int) -> None:
        raise RuntimeError(f"receiver refused grant {grant_id}")

    background = BackgroundTasks()
    async with database.sessions() as session:
        run_after_response(background, session, explode, 7)
    with caplog.at_level(logging.ERROR, logger="app.after_response"):
        await background()
    assert "receiver refused grant 7" in caplog.text
