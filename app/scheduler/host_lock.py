"""The host's first round: one process per host contends for the leader key.

Without it every worker holds a lock connection of its own, so 8 workers on each of
50 hosts keep 400 PostgreSQL backends waiting on one key. With it, the workers of a
host first take an exclusive ``flock`` on one file in their runtime directory
(REGENT_RUNTIME_DIR); only the holder opens the lock connection and queues in
PostgreSQL, as a standby or the leader. The others poll the file every
HOST_POLL_SECONDS on the clock (never blocking the event loop). The kernel drops the
flock when its holder dies, however it dies, so another worker of the host joins the
PostgreSQL queue within a poll and a connect. A worker keeps the flock through
demotions and reconnects and lets go when its supervisor stops.

The file is named after the lock DSN and the key, so two apps (or two test databases)
sharing a runtime directory never queue behind each other. The leader is always a
flock holder; a flock holder that is a standby in PostgreSQL is the normal case.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import tempfile
from pathlib import Path

from .clock import Clock
from .errors import SchedulerError

__all__ = ["HOST_POLL_SECONDS", "HostLock", "HostLockError", "default_runtime_dir"]

# How often a worker that does not hold the host's flock tries for it.
HOST_POLL_SECONDS = 0.05


class HostLockError(SchedulerError):
    """The runtime directory cannot hold the host's lock file: it cannot be created or
    opened, or it belongs to another user (who could hold the flock forever).
    ``directory`` is the path."""

    def __init__(self, directory: Path, problem: str) -> None:
        super().__init__(
            f"REGENT_RUNTIME_DIR {str(directory)!r} {problem}; set REGENT_RUNTIME_DIR to a "
            "directory of this user that every worker of this host can write, or "
            "HOST_LOCK_ENABLED=false to let every worker queue in PostgreSQL"
        )
        self.directory = directory


def default_runtime_dir() -> Path:
    """Where the host's lock file lives when REGENT_RUNTIME_DIR is not set: the user's
    runtime directory ($XDG_RUNTIME_DIR, else /run/user/<uid>) when it exists, else
    regent-<uid> in the temporary directory."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "regent"
    run_user = Path("/run/user") / str(os.getuid())
    if run_user.is_dir():
        return run_user / "regent"
    return Path(tempfile.gettempdir()) / f"regent-{os.getuid()}"


class HostLock:
    """An exclusive flock on the file one host's workers share for one leader key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @classmethod
    def for_key(cls, directory: Path, dsn: str, key: int | str) -> HostLock:
        """The host lock of ``key`` on the server ``dsn`` reaches, in ``directory``."""
        digest = hashlib.sha256(f"{dsn}\0{key}".encode()).hexdigest()[:16]
        return cls(directory / f"leader-{digest}.lock")

    @property
    def held(self) -> bool:
        """True while this process holds the flock through this object."""
        return self._fd is not None

    def try_acquire(self) -> bool:
        """One non-blocking attempt; True when the flock is ours (or already was).

        Raises HostLockError when the directory cannot be used.
        """
        if self._fd is not None:
            return True
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    async def acquire(self, clock: Clock) -> None:
        """Return once the flock is ours, trying every HOST_POLL_SECONDS on ``clock``.

        Raises HostLockError when the directory cannot be used.
        """
        while not self.try_acquire():
            await clock.sleep(HOST_POLL_SECONDS)

    def release(self) -> None:
        """Let go of the flock (closing the file releases it); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _open(self) -> int:
        directory = self.path.parent
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = directory.stat()
            if not stat.S_ISDIR(info.st_mode):
                raise HostLockError(directory, "is not a directory")
            if info.st_uid != os.getuid():
                raise HostLockError(directory, f"belongs to user id {info.st_uid}, not to this one")
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise HostLockError(directory, f"cannot hold the lock file: {exc}") from exc
