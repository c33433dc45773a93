"""The embedded PostgreSQL is its owner's alone: no other local user can connect to it,
read its password or its files, or stand in for it and be sent a password; and the
application's role is no superuser, so it cannot run programs as the server's account.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from psycopg import errors
from sqlalchemy.engine import make_url

from app.embedded import embedded_postgres
from app.localpg import APP_ROLE, LocalPostgres, LocalPostgresError, free_port

from .conftest import AsOther, Impostor

# Tries to open each path given (a socket is connected to) and prints the ones it could.
OPEN_EACH = r"""
import socket, stat, sys, os
for path in sys.argv[1:]:
    try:
        if path.startswith("tcp:"):
            socket.create_connection(("127.0.0.1", int(path[4:])), timeout=5).close()
        elif stat.S_ISSOCK(os.stat(path).st_mode):
            with socket.socket(socket.AF_UNIX) as unix:
                unix.connect(path)
        else:
            with open(path, "rb") as file:
                file.read(1)
    except OSError:
        continue
    print(path, flush=True)
"""


def _password(server: LocalPostgres) -> str:
    password = make_url(server.url).password
    assert password
    return password


def _every_path_under(root: Path) -> list[str]:
    return [str(path) for path in sorted(root.rglob("*"))]


def test_a_fake_server_on_the_old_port_captures_no_password_from_the_cli(
    stopped_embedded_server: LocalPostgres, impostor: Callable[[int], Impostor]
) -> None:
    server = stopped_embedded_server
    fake = impostor(server.port)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {
        "REGENT_DATA_DIR": str(server.data_dir.parent),
        "REGENT_PG_PORT": str(server.port),
        "DATABASE_CONNECT_TIMEOUT_SECONDS": "5",
    }
    subprocess.run(
        [sys.executable, "-m", "app", "jobs"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    captured = fake.captured()
    assert _password(server) not in captured
    assert captured == "", f"the impostor was sent: {captured}"


def test_with_tcp_asked_for_the_url_for_other_tools_sends_no_password_to_an_impostor(
    reachable_dir: Path, impostor: Callable[[int], Impostor]
) -> None:
    with embedded_postgres(reachable_dir / "regent", free_port(), tcp=True) as server:
        tcp_url = server.tcp_url_for(server.database)
        with psycopg.connect(tcp_url, connect_timeout=5) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (APP_ROLE,)
    fake = impostor(server.port)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(tcp_url, connect_timeout=5).close()
    captured = fake.captured()
    assert captured == "", f"the impostor was sent: {captured}"


def test_another_user_cannot_connect_to_the_embedded_database(
    embedded_server: LocalPostgres, as_other: AsOther
) -> None:
    root = embedded_server.data_dir.parent
    endpoints = [f"tcp:{embedded_server.port}", *_every_path_under(root)]
    endpoints += [f"{d}/.s.PGSQL.{embedded_server.port}" for d in ("/tmp", "/var/run/postgresql")]
    probe = as_other(OPEN_EACH, *endpoints)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout == "", f"another user reached: {probe.stdout.split()}"


def test_another_user_reads_no_file_of_the_embedded_data_directory(
    embedded_server: LocalPostgres, as_other: AsOther
) -> None:
    root = embedded_server.data_dir.parent
    paths = [*_every_path_under(root), str(embedded_server.log_path)]
    probe = as_other(OPEN_EACH, *paths)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout == "", f"another user read: {probe.stdout.split()}"


def test_the_applications_role_cannot_run_programs_as_the_servers_account(
    embedded_server: LocalPostgres,
) -> None:
    with psycopg.connect(embedded_server.url, autocommit=True) as conn:
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("COPY (SELECT 1) TO PROGRAM 'true'")
        super_user = conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert super_user == (False,)


def test_a_data_directory_another_user_made_is_refused(
    shared_tmp: Path, as_other: AsOther, other_user: pwd.struct_passwd
) -> None:
    data_dir = shared_tmp / "regent"
    made = as_other("import os, sys; os.mkdir(sys.argv[1], 0o777)", str(data_dir))
    assert made.returncode == 0, made.stderr
    refused = pytest.raises(LocalPostgresError, match=f"belongs to {other_user.pw_name}")
    with refused, embedded_postgres(data_dir, free_port()):
        pass
    assert not (data_dir / "pgdata").exists(), "a server was made in it before the refusal"


def test_a_data_directory_that_is_a_link_is_refused(reachable_dir: Path) -> None:
    (reachable_dir / "elsewhere").mkdir()
    (reachable_dir / "regent").symlink_to(reachable_dir / "elsewhere")
    refused = pytest.raises(LocalPostgresError, match="not a directory")
    with refused, embedded_postgres(reachable_dir / "regent", free_port()):
        pass


# What an injection into the app's SQL could leave in the app's own database: an
# operator in ``public`` that matches ``oid = integer`` better than pg_catalog's, whose
# function makes the app's role a superuser when a superuser runs it.
_SUPERUSER_TRAP = """
CREATE FUNCTION public.trap_eq(oid, integer) RETURNS boolean LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user) THEN
    EXECUTE 'ALTER ROLE regent_app SUPERUSER';
  END IF;
  RETURN $1 OPERATOR(pg_catalog.=) $2::oid;
END $$;
CREATE OPERATOR public.= (LEFTARG = oid, RIGHTARG = integer, FUNCTION = public.trap_eq);
ALTER DATABASE regent SET search_path = public, pg_catalog;
"""


def test_the_applications_role_cannot_become_a_superuser_at_the_next_start(
    reachable_dir: Path,
) -> None:
    data_dir, port = reachable_dir / "regent", free_port()
    with (
        embedded_postgres(data_dir, port) as server,
        psycopg.connect(server.url, autocommit=True) as conn,
    ):
        conn.execute(_SUPERUSER_TRAP)
    with (
        embedded_postgres(data_dir, port) as server,
        psycopg.connect(server.url, autocommit=True) as conn,
    ):
        super_user = conn.execute(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
    assert super_user == (False,), "the app's role made itself a superuser at the restart"


def test_no_superuser_has_a_password_or_the_applications_database(
    embedded_server: LocalPostgres,
) -> None:
    with psycopg.connect(embedded_server.url, autocommit=True) as conn:
        superusers = [
            name for (name,) in conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper")
        ]
        [owner] = conn.execute(
            "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
        ).fetchone() or [None]
    assert superusers, "the server has no superuser"
    assert owner not in superusers, f"the app's database belongs to superuser {owner}"
    # Read as the superuser, whom only the server's account and root reach (peer).
    with psycopg.connect(embedded_server.superuser_conninfo("postgres")) as conn:
        with_password = conn.execute(
            "SELECT rolname FROM pg_authid WHERE rolsuper AND rolpassword IS NOT NULL"
        ).fetchall()
    assert with_password == [], "a superuser takes a password"


def test_a_root_start_with_no_postgres_account_refuses_in_one_line(
    reachable_dir: Path, other_user: pwd.struct_passwd
) -> None:
    no_postgres_account = (
        "import pwd, sys\n"
        "real = pwd.getpwnam\n"
        "def getpwnam(name):\n"
        "    if name == 'postgres':\n"
        "        raise KeyError(name)\n"
        "    return real(name)\n"
        "pwd.getpwnam = getpwnam\n"
        "from app.__main__ import main\n"
        "sys.exit(main(['migrate']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["REGENT_DATA_DIR"] = str(reachable_dir / "regent")
    result = subprocess.run(
        [sys.executable, "-c", no_postgres_account],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    pgdata = reachable_dir / "regent" / "pgdata"
    assert not pgdata.exists() or pgdata.stat().st_uid != other_user.pw_uid, (
        f"the database ran as {other_user.pw_name}"
    )
    assert result.returncode == 2, result.stderr
    [error] = [line for line in result.stderr.splitlines() if "error" in line]
    assert error.startswith("regent: error:") and "useradd" in error
