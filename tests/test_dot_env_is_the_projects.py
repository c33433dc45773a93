"""A project's ``.env`` is read by every command run inside the project, as its
migrations are found: from its root (the nearest directory, from the working directory
up, holding ``migrations/env.py`` or a ``pyproject.toml``), with a ``.env`` in the working
directory itself on top of it."""

from pathlib import Path

import pytest

from app.settings import load_settings


@pytest.fixture
def project_with_a_dot_env(user_project: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project (a pyproject.toml) whose root ``.env`` sets TIMEZONE and LOG_LEVEL;
    neither is set in the environment."""
    (user_project / "pyproject.toml").write_text('[project]\nname = "myapp"\n')
    (user_project / ".env").write_text("TIMEZONE=Europe/Berlin\nLOG_LEVEL=WARNING\n")
    monkeypatch.delenv("TIMEZONE", raising=False)
    monkeypatch.delenv("LOG_LEVEL", raising=False)
    return user_project


def test_a_command_run_in_a_subdirectory_reads_the_projects_dot_env(
    project_with_a_dot_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subdirectory = project_with_a_dot_env / "src" / "myapp"
    subdirectory.mkdir(parents=True)
    monkeypatch.chdir(subdirectory)

    assert load_settings().TIMEZONE == "Europe/Berlin"


def test_a_dot_env_in_the_working_directory_goes_over_the_projects(
    project_with_a_dot_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    subdirectory = project_with_a_dot_env / "deploy"
    subdirectory.mkdir()
    (subdirectory / ".env").write_text("TIMEZONE=Asia/Tokyo\n")
    monkeypatch.chdir(subdirectory)

    settings = load_settings()

    assert (settings.TIMEZONE, settings.LOG_LEVEL) == ("Asia/Tokyo", "WARNING")


def test_a_dot_env_above_the_working_directory_is_read_where_no_project_root_is_marked(
    user_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (user_project / ".env").write_text("TIMEZONE=Europe/Berlin\n")
    monkeypatch.delenv("TIMEZONE", raising=False)
    subdirectory = user_project / "sub"
    subdirectory.mkdir()
    monkeypatch.chdir(subdirectory)

    assert load_settings().TIMEZONE == "Europe/Berlin"


def test_a_dot_env_above_a_marked_project_root_is_not_read(
    user_project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (user_project / ".env").write_text("TIMEZONE=Europe/Berlin\n")
    monkeypatch.delenv("TIMEZONE", raising=False)
    inner = user_project / "inner"
    inner.mkdir()
    (inner / "pyproject.toml").write_text('[project]\nname = "inner"\n')
    monkeypatch.chdir(inner)

    assert load_settings().TIMEZONE == "UTC"
