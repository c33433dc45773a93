"""The README's settings are told in two tables: the engine's and library's, then the
demo jobs' (the settings only app/jobs reads), so a user of the library knows which
ones are theirs to set."""

from __future__ import annotations

import re
from pathlib import Path

from app.settings import Settings

REPOSITORY = Path(__file__).resolve().parent.parent
_ROW = re.compile(r"^\| `([A-Z_]+)`(?:, `([A-Z_]+)`)? \|", re.MULTILINE)


def _table_after(heading: str) -> set[str]:
    """The variables of the first table under ``heading`` (a markdown heading line)."""
    readme = (REPOSITORY / "README.md").read_text()
    start = readme.index(f"\n{heading}\n")
    section = readme[start + len(heading) + 2 :]
    section = section[: section.index("\n#")] if "\n#" in section else section
    return {name for row in _ROW.findall(section) for name in row if name}


def _read_only_by_demo_jobs() -> set[str]:
    """The Settings fields that no module outside app/jobs (and settings.py) names."""
    sources = [
        path
        for path in (REPOSITORY / "app").rglob("*.py")
        if path.name != "settings.py" and "jobs" not in path.relative_to(REPOSITORY).parts[:2]
    ]
    text = "\n".join(path.read_text() for path in sources)
    return {field for field in Settings.model_fields if field not in text}


def test_the_readme_tells_the_demo_jobs_settings_apart_from_the_engines() -> None:
    demo = _table_after("### The demo jobs' settings")
    engine = _table_after("## Settings")
    assert demo == _read_only_by_demo_jobs()
    assert engine.isdisjoint(demo)
    assert engine | demo >= set(Settings.model_fields)
