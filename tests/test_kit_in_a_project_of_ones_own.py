"""The test kit in a project of one's own: the README's snippets alone make a project
whose tests pass with no pytest settings, and each test's database holds the project's
own migrations as well as Regent's."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.testing import TestServer

REPOSITORY = Path(__file__).resolve().parent.parent

# A fenced Python block of the README whose first line names the file it is.
_FILE_BLOCK = re.compile(r"```python\n# (?P<path>[\w/]+\.py)\n(?P<code>.*?)```", re.DOTALL)

_SIGNUPS_TEST = """
from sqlalchemy import text


async def test_the_signups_table_is_there(regent_database):
    async with regent_database.engine.begin() as conn:
        await conn.execute(text("INSERT INTO signups (email) VALUES ('ada@example.com')"))
"""


def _pytest(project: Path, server: TestServer) -> subprocess.CompletedProcess[str]:
    """Run pytest in the project, as its user would, on the suite's server."""
    env = os.environ | {"TEST_DATABASE_URL": server.admin_url}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """An empty directory with a pytest configuration of no settings at all."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pytest.ini").write_text("[pytest]\n")
    return root


def test_a_project_made_of_the_readmes_snippets_passes_its_tests_with_no_settings(
    project: Path, pg_server: TestServer
) -> None:
    blocks = _FILE_BLOCK.finditer((REPOSITORY / "README.md").read_text())
    written = set()
    for block in blocks:
        path = project / block["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block["code"])
        written.add(block["path"])
    assert {"myapp/jobs.py", "conftest.py", "tests/test_reminders.py"} <= written

    done = _pytest(project, pg_server)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_each_tests_database_holds_the_projects_own_migrations(
    project: Path, pg_server: TestServer
) -> None:
    subprocess.run(
        [sys.executable, "-m", "app", "revision", "-m", "signups"],
        cwd=project,
        check=True,
        capture_output=True,
    )
    (revision,) = (project / "migrations" / "versions").glob("*.py")
    revision.write_text(
        revision.read_text().replace(
            "def upgrade() -> None:\n    pass\n",
            "def upgrade() -> None:\n"
            '    op.execute("CREATE TABLE signups (id serial PRIMARY KEY, email text NOT NULL)")\n',
        )
    )
    (project / "conftest.py").write_text('pytest_plugins = ["app.testing.plugin"]\n')
    (project / "tests").mkdir()
    (project / "tests" / "test_signups.py").write_text(_SIGNUPS_TEST)

    done = _pytest(project, pg_server)

    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
