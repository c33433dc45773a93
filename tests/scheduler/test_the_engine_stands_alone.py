"""The engine is a library: a process that runs the scheduler on Regent's database
layer alone (a worker of someone else's app, a bench) loads neither the admin's nor the
settings' dependencies, which are its app's to choose."""

from __future__ import annotations

import subprocess
import sys


def test_the_scheduler_and_its_database_layer_load_no_pydantic() -> None:
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, app.scheduler, app.db; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'pydantic_settings', 'dotenv', 'fastapi')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "[]"
