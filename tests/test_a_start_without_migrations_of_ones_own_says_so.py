"""An app that starts where it finds no migrations of its own (a wheel carries none, so
a project deployed as one and started outside its checkout) says so in one log line
naming where it looked and REGENT_MIGRATIONS: its own tables are checked by nothing.
With REGENT_MIGRATIONS empty (none, on purpose) it says nothing."""

import logging
from pathlib import Path

import pytest

from app.main import create_app
from app.settings import load_settings

from .test_app import _Lifespan

_EVENT = "app.no_migrations_of_yours"


async def _start_in(
    directory: Path, database_url: str, monkeypatch: pytest.MonkeyPatch, **settings: object
) -> None:
    monkeypatch.chdir(directory)
    async with _Lifespan(
        create_app(load_settings(_env_file=None, DATABASE_URL=database_url, **settings))
    ):
        pass


async def test_a_start_that_finds_no_migrations_of_its_own_says_where_it_looked(
    user_project: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="app"):
        await _start_in(user_project, database_url, monkeypatch)

    [line] = [record.getMessage() for record in caplog.records if _EVENT in record.getMessage()]
    assert str(user_project) in line
    assert "REGENT_MIGRATIONS" in line


async def test_a_start_with_regent_migrations_empty_says_nothing_of_them(
    user_project: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="app"):
        await _start_in(user_project, database_url, monkeypatch, REGENT_MIGRATIONS="")

    assert not [record for record in caplog.records if _EVENT in record.getMessage()]
