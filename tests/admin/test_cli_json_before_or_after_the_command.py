"""`--json` on the read commands of `python -m app`, given before the command
(`python -m app --json jobs`), between it and its sub-command (`jobs --json history
ID`) or after it (`jobs history ID --json`): each prints JSON alike. A command that
prints no table takes no --json."""

from __future__ import annotations

import json

import pytest

from .conftest import app_command

# Each read command, as the words after `python -m app` and before any option.
_READERS = [
    ["jobs"],
    ["jobs", "--all"],
    ["jobs", "history", "report"],
    ["outbox", "list"],
    ["outbox", "pending"],
    ["outbox", "scheduled"],
    ["outbox", "stuck"],
    ["leader"],
    ["prune", "--dry-run"],
]


def _positions(words: list[str]) -> list[list[str]]:
    """``words`` with --json before the command, after its group (when it has a
    sub-command) and at the end."""
    placed = [["--json", *words], [*words, "--json"]]
    if len(words) > 1 and not words[1].startswith("-"):
        placed.append([words[0], "--json", *words[1:]])
    return placed


@pytest.mark.usefixtures("unled_report")
@pytest.mark.parametrize(
    "args", [args for words in _READERS for args in _positions(words)], ids=" ".join
)
def test_every_read_command_prints_json_wherever_json_is_given(
    database_url: str, args: list[str]
) -> None:
    printed = app_command(database_url, *args)
    assert printed.returncode == 0, printed.stderr
    json.loads(printed.stdout)


@pytest.mark.parametrize("command", ["migrate", "db-url", "serve"])
def test_json_before_a_command_that_prints_no_table_is_refused_in_one_line(
    database_url: str, command: str
) -> None:
    refused = app_command(database_url, "--json", command)
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert "--json" in line
