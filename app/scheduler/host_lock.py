"""The host's first round: the right to queue for the leader key, one worker per host.

Without it every worker holds a lock connection of its own, so 8 workers on each of
50 hosts keep 400 PostgreSQL backends waiting on one key. With it, the workers of a
host first take an exclusive ``flock`` on one file in their runtime directory
(REGENT_RUNTIME_DIR); only the holder opens a lock connection and queues in PostgreSQL
as a standby. The others poll the file every HOST_POLL_SECONDS on the clock (never
blocking the event loop).

The flock is the right to queue, not to lead: a holder that is granted the key lets go
of the flock as it is promoted, so another worker of its host takes the flock and
queues in PostgreSQL behind it. A leader that hangs (SIGSTOP, a paused VM, a blocked
event loop) then loses the key when the server's ``idle_session_timeout`` (the lease)
ends its lock connection, and that standby of its own host is granted it: a hang is
replaced within the lease, as on a host of its own. The cost: the leader's host keeps
two lock connections (the leader and one standby), every other host one. A leader that
steps down contends for the flock again like any worker.

The flock has a lease too, on the server: the holder writes its pid and, once open, its
lock connection's backend pid into the file, and a worker waiting for the flock asks the
server every leader tick whether that connection is still listed. The kernel drops the
flock when its holder dies, however it dies, so another worker of the host queues within
a poll and a connect; a holder that hangs instead keeps the flock, but not its lock
connection: once granted the key its session is idle and the server ends it after the
lease (while it waits for the key a live leader leads elsewhere). A holder whose lock
connection has been gone for a lease, on the lease clock (the server's), is passed: the
waiting workers of its host queue without the flock (``scheduler.host_lock_passed``),
until they lead or the flock comes free. So a standby hung while queued delays its
host's next leader by at most two leases and a tick, never for good.

The file is named after the lock DSN and the key, so two apps (or two test databases)
sharing a runtime directory never queue behind each other.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from .clock import Clock
from .errors import SchedulerError
from .loop import Stop, run_loop

__all__ = [
    "HOST_POLL_SECONDS",
    "Holder",
    "HolderProbe",
    "HostLock",
    "HostLockError",
    "default_runtime_dir",
]

# Root's runtime directory when it has no /run/user/0: only root may make entries in it.
_RUN = Path("/run")
# How often a worker that does not hold the host's flock tries for it.
HOST_POLL_SECONDS = 0.05
# The holder's record at the start of the file: two fixed-width fields, so that one
# pwrite replaces it whole and a reader never sees two records mixed.
_RECORD = "{pid:>11} {backend_pid:>11}\n"
_RECORD_SIZE = len(_RECORD.format(pid=0, backend_pid=0))


@dataclass(frozen=True)
class Holder:
    """Who holds a host's lock file, as the holder wrote it: its process id and its
    lock connection's backend pid (None until that connection is open). A record that
    cannot be read is ``Holder(0, None)``: nobody the server can list."""

    pid: int
    backend_pid: int | None


# Asks the server whether ``holder``'s lock connection is listed, answering (listed,
# the lease clock's now), or None when the server does not answer (no evidence).
HolderProbe = Callable[[Holder], Awaitable[tuple[bool, datetime] | None]]


class HostLockError(SchedulerError):
    """The runtime directory cannot hold the host's lock file: it cannot be created or
    opened, it belongs to another user (who could hold the flock forever), or other users
    can write it (and replace the file). The supervisor then queues without the host
    lock. ``directory`` is the path."""

    def __init__(self, directory: Path, problem: str) -> None:
        super().__init__(
            f"REGENT_RUNTIME_DIR {str(directory)!r} {problem}; set REGENT_RUNTIME_DIR to a "
            "directory of this user that every worker of this host can write, or "
            "HOST_LOCK_ENABLED=false to let every worker queue in PostgreSQL"
        )
        self.directory = directory


def default_runtime_dir() -> Path:
    """Where the host's lock file lives when REGENT_RUNTIME_DIR is not set: the user's
    runtime directory ($XDG_RUNTIME_DIR, else /run/user/<uid>) when it exists; as root
    /run/regent; else regent-<uid> in the temporary directory.

    Only the last can be made first by another user (the temporary directory is
    everyone's): then the worker finds it unusable and queues without the host lock
    (HostLockError, ``scheduler.host_lock_unusable``), never refused.
    """
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_dir():
        return Path(xdg) / "regent"
    run_user = Path("/run/user") / str(os.getuid())
    if run_user.is_dir():
        return run_user / "regent"
    if os.getuid() == 0 and _RUN.is_dir():
        return _RUN / "regent"
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

    def try_acquire(self) -> bool:
        """One non-blocking attempt; True when the flock is ours (or already was).

        Raises HostLockError when the directory cannot be used.
        """
        if self._fd is not None:
            return True
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write(fd, Holder(os.getpid(), None))
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError as exc:
            os.close(fd)
            raise HostLockError(self.path.parent, f"cannot hold the lock file: {exc}") from exc
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def queues_on(self, backend_pid: int) -> None:
        """Record, while the flock is ours, the backend pid of the lock connection with
        which this process queues: the workers waiting for the flock ask the server
        whether it is still listed. Does nothing when the flock is not ours."""
        if self._fd is not None:
            # A record left unwritten only lets the waiting workers pass this holder
            # after a lease: one more lock connection, never a second leader.
            with contextlib.suppress(OSError):
                _write(self._fd, Holder(os.getpid(), backend_pid))

    def holder(self) -> Holder:
        """The holder's record as the file has it now (``Holder(0, None)`` when there is
        no readable one)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return Holder(0, None)
        try:
            pid, backend_pid = (int(field) for field in os.pread(fd, _RECORD_SIZE, 0).split())
        except (OSError, ValueError):
            return Holder(0, None)
        finally:
            os.close(fd)
        return Holder(pid, backend_pid or None)

    async def acquire(
        self, clock: Clock, *, lease_seconds: float, check_seconds: float, probe: HolderProbe
    ) -> bool:
        """Return True once the flock is ours, trying every HOST_POLL_SECONDS on
        ``clock``. Return False once its holder has had no lock connection listed on the
        server for ``lease_seconds`` on the lease clock, asked through ``probe`` every
        ``check_seconds``: that holder hangs, and the caller queues without the flock.
        A new holder, or its connection listed again, starts the count anew; an
        unanswered probe changes nothing (in doubt, wait).

        Raises HostLockError when the directory cannot be used.
        """
        polls_per_check = max(1, round(check_seconds / HOST_POLL_SECONDS))
        polls = 0
        seen: Holder | None = None
        unlisted_since: datetime | None = None

        async def poll() -> float | Stop[bool]:
            nonlocal polls, seen, unlisted_since
            if self.try_acquire():
                return Stop(True)
            polls += 1
            if polls % polls_per_check == 0:
                holder = self.holder()
                answer = await probe(holder)
                if holder != seen:
                    seen, unlisted_since = holder, None
                if answer is not None:
                    listed, now = answer
                    if listed:
                        unlisted_since = None
                    elif unlisted_since is None:
                        unlisted_since = now
                    elif (now - unlisted_since).total_seconds() >= lease_seconds:
                        return Stop(False)
            return HOST_POLL_SECONDS

        return await run_loop(poll, clock)

    def release(self) -> None:
        """Let go of the flock (closing the file releases it); idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _open(self) -> int:
        directory = self.path.parent
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            # lstat: a link another user planted would lead to a directory of theirs.
            info = directory.lstat()
            if not stat.S_ISDIR(info.st_mode):
                raise HostLockError(directory, "is not a directory")
            if info.st_uid != os.getuid():
                raise HostLockError(directory, f"belongs to user id {info.st_uid}, not to this one")
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                # Others could replace the lock file, and two workers hold "the" flock.
                raise HostLockError(
                    directory, f"can be written by other users (mode {info.st_mode & 0o777:o})"
                )
            return os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise HostLockError(directory, f"cannot hold the lock file: {exc}") from exc


def _write(fd: int, holder: Holder) -> None:
    """Replace the holder's record in the open lock file ``fd`` (one pwrite)."""
    record = _RECORD.format(pid=holder.pid, backend_pid=holder.backend_pid or 0)
    os.pwrite(fd, record.encode(), 0)
