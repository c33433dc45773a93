"""Security fixtures: another local user (``nobody``) to act against Regent's files."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

__all__ = ["AsOther"]

# An interpreter every user may run (the venv's may live under /root); the probes the
# other user runs need only the standard library.
_SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3")

# Runs ``python -c CODE ARGS...`` as the other user; returns the finished process.
AsOther = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def other_user() -> pwd.struct_passwd:
    """An unprivileged local user that is not the one Regent runs as; the test needs
    root to act as it."""
    if os.geteuid() != 0:
        pytest.skip("acting as another local user needs root (the suite runs as root in CI)")
    try:
        return pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user on this machine to act as another local user")


@pytest.fixture
def as_other(other_user: pwd.struct_passwd) -> AsOther:
    """Run Python code as the other user (real uid and gid, no supplementary groups),
    with a system interpreter."""
    python = next((path for path in _SYSTEM_PYTHONS if os.access(path, os.X_OK)), None)
    if python is None:
        pytest.skip(f"no system python3 ({', '.join(_SYSTEM_PYTHONS)}) for the other user")

    def run(code: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        def drop() -> None:
            os.setgroups([])
            os.setgid(other_user.pw_gid)
            os.setuid(other_user.pw_uid)

        return subprocess.run(
            [python, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=drop,
            cwd="/",
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/"},
            check=False,
        )

    return run


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory like /tmp (mode 1777, every user may make entries in it), of this
    test alone."""
    path = Path(tempfile.mkdtemp(prefix="regent-shared-"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
