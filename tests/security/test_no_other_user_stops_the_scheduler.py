"""No other local user can stop the scheduler through the host lock's directory: the
default place cannot be made by another user, and a directory another user made (or
can write) only costs this worker its host lock: it queues in PostgreSQL and says why.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

import pytest

from app.scheduler import Role, Scheduler
from app.scheduler.host_lock import default_runtime_dir

from ..conftest import StartScheduler
from .conftest import AsOther

MAKE_DIRECTORY = "import os, sys; os.mkdir(sys.argv[1], 0o777); os.chmod(sys.argv[1], 0o777)"


def test_the_default_host_lock_directory_cannot_be_made_by_another_user(
    as_other: AsOther, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    if Path(f"/run/user/{os.getuid()}").is_dir():
        pytest.skip(f"/run/user/{os.getuid()} exists: the default is the user's runtime dir")
    old_default = shared_tmp / f"regent-{os.getuid()}"
    made = as_other(MAKE_DIRECTORY, str(old_default))
    assert made.returncode == 0, made.stderr
    directory = default_runtime_dir()
    assert directory != old_default, "the default is a directory another user made"
    if directory.exists():
        assert directory.stat().st_uid == os.getuid(), f"{directory} taken by another user"
    else:
        attempt = as_other(MAKE_DIRECTORY, str(directory))
        assert attempt.returncode != 0, f"another user made {directory}, the default"
        assert "PermissionError" in attempt.stderr


async def test_a_host_lock_directory_another_user_made_leaves_the_worker_queueing_in_postgres(
    as_other: AsOther,
    start_scheduler: StartScheduler,
    shared_tmp: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="app.scheduler")
    taken = shared_tmp / f"regent-{os.getuid()}"
    made = as_other(MAKE_DIRECTORY, str(taken))
    assert made.returncode == 0, made.stderr
    supervisor = await start_scheduler(Scheduler(), host_lock_dir=taken)
    assert await supervisor.wait_for_role(Role.LEADER, Role.STOPPED) == Role.LEADER, (
        supervisor.refusal
    )
    [record] = [r for r in caplog.records if r.getMessage().startswith("scheduler.host_lock_")]
    assert record.getMessage().startswith("scheduler.host_lock_unusable")
    assert str(taken) in record.getMessage()
