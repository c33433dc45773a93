"""`python -m app --workers N` whose workers each refuse to start (a refusal only the
app's lifespan can make, after the server started them) exits non-zero, as one worker
does: a supervisor (systemd, a container runtime) sees the failure, not a clean stop."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.localpg import free_port


@pytest.mark.multiprocess
@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_whose_workers_refuse_to_start_exits_with_the_start_up_failure_status(
    database_url: str, workers: str
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "app",
            "--app",
            "tests.procs.undrained_outbox_app:app",
            "--port",
            str(free_port()),
            "--workers",
            workers,
        ],
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "outbox 'undrained' has no drain" in done.stderr


def _production_commands() -> list[str]:
    """The commands README's "Run it" step gives for serving with several workers."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    step = readme[readme.index("4. Run it:") : readme.index("5. Test it")]
    return [
        command
        for command in re.findall(r"`([^`]+)`", step.replace("\n   ", " "))
        if "--workers" in command and "myapp.main:app" in command
    ]


@pytest.mark.multiprocess
def test_the_readmes_production_command_exits_non_zero_when_its_workers_cannot_start(
    database_url: str,
) -> None:
    # Plain `uvicorn --workers N` stops with status 0 when every worker failed to start:
    # a process supervisor would take that for a clean stop.
    commands = _production_commands()
    assert commands, "README's step 4 gives no command with --workers"
    for command in commands:
        words = command.split()
        words = words[1:] if words[0].startswith("DATABASE_URL=") else words
        assert words[:3] == ["python", "-m", "regent"], command
        # The README's app, as one whose workers refuse to start (an undrained outbox).
        arguments = [
            "tests.procs.undrained_outbox_app:app" if word == "myapp.main:app" else word
            for word in words[3:]
        ]
        served = subprocess.run(
            [sys.executable, "-m", "app", *arguments, "--port", str(free_port())],
            env={**os.environ, "DATABASE_URL": database_url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert served.returncode != 0, served.stderr
        assert "outbox 'undrained' has no drain" in served.stderr
