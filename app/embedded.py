"""The embedded default: a local PostgreSQL for `python -m app` without DATABASE_URL.

Its data directory survives restarts. One `python -m app` at a time may use it: a
second one is refused by a lock file before it could start a second postmaster. It
holds one project's database: the first project started on it claims it
(``regent.project``), and another is refused, for the default directory is one per
user (as root, one per machine) and a second project would migrate, retire the jobs
of, and serve the first's.

The directory is its owner's: one another user made, or a link, is refused (its owner
could move pgdata/ aside and answer on its socket). Others may pass through it (the
server's account, as root, must reach pgdata/) but list and read nothing; the server's
socket is in pgdata/ (see app/localpg/).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from .invocation import program
from .localpg import LocalPostgres, LocalPostgresError, local_url, user_name

__all__ = ["default_data_dir", "embedded_postgres", "embedded_url", "socket_path"]

_PGDATA = "pgdata"
_PROJECT_FILE = "regent.project"
_DATABASE = "regent"


def default_data_dir() -> Path:
    """/var/lib/regent as root; $XDG_DATA_HOME/regent (~/.local/share/regent) otherwise.

    As root the server runs as another user, which cannot enter /root.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/regent")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "regent"


def embedded_url(data_dir: Path, port: int) -> str:
    """URL of the app database on the embedded server of ``data_dir`` (one a running
    `python -m app` started), through its socket, with its password.

    Raises LocalPostgresError when the password file cannot be read, naming the
    settings that point at the embedded server.
    """
    try:
        return local_url(data_dir / _PGDATA, port, _DATABASE)
    except LocalPostgresError as exc:
        raise LocalPostgresError(
            f"no embedded PostgreSQL in {data_dir} (REGENT_DATA_DIR) for port {port} "
            f"(REGENT_PG_PORT): {exc}"
        ) from None


def socket_path(data_dir: Path, port: int) -> Path:
    """Where the embedded server of ``data_dir`` listens for ``port``."""
    return data_dir / _PGDATA / f".s.PGSQL.{port}"


@contextlib.contextmanager
def embedded_postgres(
    data_dir: Path, port: int, *, tcp: bool = False, project: Path | None = None
) -> Iterator[LocalPostgres]:
    """Run the embedded server in ``data_dir`` for the duration of the block, on its
    socket only, or on 127.0.0.1:``port`` too when ``tcp``; for ``project`` (its root,
    app/project.py), which claims a directory no project has claimed yet.

    Raises LocalPostgresError when another `python -m app` holds the directory, another
    project claimed it, the port is taken, the directory belongs to someone else, or no
    binaries exist.
    """
    lock_path = data_dir / "regent.lock"
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        _refuse_unless_ours(data_dir)
        data_dir.chmod(0o711)
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        os.fchmod(descriptor, 0o600)
        lock_file = os.fdopen(descriptor, "r+")
    except OSError as exc:
        raise LocalPostgresError(
            f"cannot use data directory {data_dir} ({exc.strerror}); set REGENT_DATA_DIR "
            "to a directory this user may create and write"
        ) from None
    with lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            holder = lock_file.read().strip() or "another process"
            raise LocalPostgresError(
                f"data directory {data_dir} is in use by `{program()}` (pid {holder}); "
                "stop that one first, or set REGENT_DATA_DIR to another directory"
            ) from None
        lock_file.seek(0)
        lock_file.truncate()
        lock_file.write(str(os.getpid()))
        lock_file.flush()
        if project is not None:
            _claim(data_dir, project)
        server = LocalPostgres(data_dir / _PGDATA, port=port, database=_DATABASE, tcp=tcp)
        server.start()
        try:
            yield server
        finally:
            server.stop()


def _refuse_unless_ours(data_dir: Path) -> None:
    """Raise LocalPostgresError unless ``data_dir`` is a directory of this user (not a
    link to one): its owner could move pgdata/ aside and answer on its socket, asking
    the app for its password (root could chmod it, but not take it back)."""
    info = data_dir.lstat()
    if not stat.S_ISDIR(info.st_mode):
        raise LocalPostgresError(
            f"data directory {data_dir} is not a directory (a link?); set REGENT_DATA_DIR "
            "to a directory of this user's"
        )
    if info.st_uid != os.geteuid():
        raise LocalPostgresError(
            f"data directory {data_dir} belongs to {user_name(info.st_uid)}, not to "
            f"{user_name(os.geteuid())}, and its owner could stand in for the database; "
            "set REGENT_DATA_DIR to a directory of this user's (or remove that one)"
        )


def _claim(data_dir: Path, project: Path) -> None:
    """Record ``project`` as the one whose database ``data_dir`` holds, unless another
    is recorded: then raise LocalPostgresError naming both and the way out. A
    directory an older version made (no record) goes to the first project started on
    it. Called under the directory's lock."""
    record = data_dir / _PROJECT_FILE
    try:
        claimed = Path(record.read_text().strip())
    except FileNotFoundError:
        descriptor = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as claim:
            claim.write(f"{project}\n")
        return
    if claimed != project:
        own = default_data_dir().with_name(f"regent-{project.name}")
        raise LocalPostgresError(
            f"data directory {data_dir} holds the database of the project in {claimed}, "
            f"not of this one ({project}); give this project its own with REGENT_DATA_DIR "
            f"(e.g. REGENT_DATA_DIR={own} {program()}, in its .env for every command), or "
            f"if {claimed} moved to {project}, remove {record}"
        )
