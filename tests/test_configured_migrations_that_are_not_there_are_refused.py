"""A REGENT_MIGRATIONS the user set that names no migrations is a mistake, told in one
line naming the directory and the fix: `migrate` exits non-zero and the app refuses to
start, never a quiet "no migrations of your own". (The default, `migrations`, may be
absent: a project without tables of its own.)"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.main import create_app
from app.settings import SettingsError, load_settings


def test_migrate_with_a_set_regent_migrations_that_is_not_there_fails_naming_it(
    user_project: Path, empty_database_url: str
) -> None:
    (user_project / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    (inside := user_project / "src").mkdir()
    env = os.environ | {"DATABASE_URL": empty_database_url, "REGENT_MIGRATIONS": "db/migrations"}

    done = subprocess.run(
        [sys.executable, "-m", "regent", "migrate"],
        cwd=inside,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode != 0, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "REGENT_MIGRATIONS" in line]
    assert str((user_project / "db" / "migrations").resolve()) in line
    assert "`python -m regent revision -m" in line


def test_the_app_refuses_to_start_with_a_set_regent_migrations_that_is_not_there(
    tmp_path: Path, database_url: str
) -> None:
    missing = tmp_path / "nowhere" / "migrations"
    settings = load_settings(
        _env_file=None, DATABASE_URL=database_url, REGENT_MIGRATIONS=str(missing)
    )

    with pytest.raises(SettingsError, match="REGENT_MIGRATIONS") as refused:
        create_app(settings)

    assert str(missing) in str(refused.value)
