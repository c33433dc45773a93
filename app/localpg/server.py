"""The local PostgreSQL server: its data directory, start, stop, crash, replica."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from ..redact import redact
from .access import (
    APP_ROLE,
    HAND_OVER,
    PASSWORD_FILE,
    SUPERUSER,
    local_url,
    read_password,
    server_account,
)
from .binaries import find_bindir
from .errors import LocalPostgresError
from .processes import alive, child_setup, children_of, port_in_use, user_name, wait_gone

__all__ = ["LocalPostgres"]

logger = logging.getLogger("app.localpg")

# The socket's path (data directory + /.s.PGSQL.<port>) must fit sun_path (108 bytes).
_MAX_SOCKET_PATH = 107


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
        self.account = server_account()
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
        password = read_password(self.data_dir)
        return (
            f"postgresql://{APP_ROLE}:{password}@127.0.0.1:{self.port}/{database}"
            "?require_auth=scram-sha-256"
        )

    def superuser_conninfo(self, database: str) -> str:
        """libpq connection string of ``database`` for the superuser, through the
        socket; it works only in the server's account or the process that started it
        (peer authentication, no password).

        Its search_path is pg_catalog's alone, set in the connection (which outranks any
        ALTER DATABASE ... SET the app's role, owner of its database, could make): the
        superuser's statements never resolve a name, an operator above all, to an
        object the app's role made."""
        return make_conninfo(
            host=str(self.data_dir),
            port=self.port,
            user=SUPERUSER,
            dbname=database,
            options="-c search_path=pg_catalog,pg_temp",
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
        if self.tcp and port_in_use(self.port):
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
                preexec_fn=child_setup(self.account, signal.SIGQUIT),
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
        children = children_of(process.pid)
        process.kill()
        process.wait()
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        for child in children:
            wait_gone(child)
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
            preexec_fn=child_setup(self.account, signal.SIGKILL),
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
                f"data directory {self.data_dir} belongs to {user_name(owner)}, but "
                f"PostgreSQL runs here as {user_name(expected)}; use a directory of your "
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
            f"--username={SUPERUSER}",
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
            preexec_fn=child_setup(self.account, signal.SIGKILL),
            check=False,
        )
        if result.returncode != 0:
            raise LocalPostgresError(
                f"initdb failed for {self.data_dir} (is every parent directory readable by "
                f"{user_name(self.account.pw_uid if self.account else os.geteuid())}?): "
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
        server_user = user_name(self.account.pw_uid if self.account else os.geteuid())
        starter = user_name(os.geteuid())
        self._write_private(
            self.data_dir / "pg_hba.conf",
            "# Written by Regent at every start (app/localpg.py): edits here do not last.\n"
            f"local all {SUPERUSER} peer map=owner\n"
            f"local replication {SUPERUSER} peer map=owner\n"
            f"host all {SUPERUSER} 127.0.0.1/32 reject\n"
            "local all all scram-sha-256\n"
            "host all all 127.0.0.1/32 scram-sha-256",
        )
        self._write_private(
            self.data_dir / "pg_ident.conf",
            "# Written by Regent at every start (app/localpg.py): edits here do not last.\n"
            + "".join(
                f"owner {user} {SUPERUSER}\n" for user in dict.fromkeys([server_user, starter])
            ),
        )

    def _clear_stale_pid_file(self) -> None:
        pid_file = self.data_dir / "postmaster.pid"
        with contextlib.suppress(FileNotFoundError, ValueError, IndexError):
            old_pid = int(pid_file.read_text().splitlines()[0])
            if alive(old_pid):
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
                sql.SQL("ALTER ROLE {} WITH PASSWORD NULL").format(sql.Identifier(SUPERUSER))
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
            conn.execute(HAND_OVER.encode())

    def _log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])
