"""`python -m app --workers N` whose workers each refuse to start (a refusal only the
app's lifespan can make, after the server started them) exits non-zero, as one worker
does: a supervisor (systemd, a container runtime) sees the failure, not a clean stop."""

import os
import subprocess
import sys

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
