"""A project's own migrations are found from anywhere inside the project: a relative
REGENT_MIGRATIONS is taken from the project's root (the nearest directory, from the
working directory up, that holds it or a pyproject.toml), so `python -m app migrate`
run in a subdirectory applies the project's chain instead of saying it has none."""

from pathlib import Path

import pytest

from app.user_migrations import user_migrations

from .test_user_migrations import _add_signups, _app, _one


@pytest.fixture
def subdirectory(user_project: Path) -> Path:
    """A directory two levels inside the user's project."""
    inside = user_project / "src" / "mypkg"
    inside.mkdir(parents=True)
    return inside


def test_migrate_in_a_subdirectory_applies_the_projects_own_migrations(
    user_project: Path, subdirectory: Path, empty_database_url: str
) -> None:
    users_head = _add_signups(user_project)

    _app(subdirectory, "migrate", database_url=empty_database_url)

    assert _one(empty_database_url, "SELECT version_num FROM alembic_version") == users_head


def test_a_projects_migrations_are_named_from_its_root_before_their_first_revision(
    user_project: Path, subdirectory: Path
) -> None:
    (user_project / "pyproject.toml").write_text('[project]\nname = "mine"\n')

    found = user_migrations("migrations", base=subdirectory)

    assert found is not None and found.directory == (user_project / "migrations").resolve()


def test_a_directory_outside_any_project_takes_its_migrations_from_itself(
    user_project: Path,
) -> None:
    found = user_migrations("migrations", base=user_project)

    assert found is not None and found.directory == (user_project / "migrations").resolve()
