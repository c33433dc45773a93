"""Security fixtures: the default app's routes (admin page and API, the example API)
served in this process as a client at a given address, and the sign-in form; another
local user (``nobody``) to act against Regent's files."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr
from sqlalchemy import text

from app.db import Database
from app.embedded import embedded_postgres
from app.jobs import build
from app.localpg import LocalPostgres, free_port
from app.main import create_app
from app.settings import Settings

__all__ = ["AsOther", "Impostor"]

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


def _system_python() -> str:
    python = next((path for path in _SYSTEM_PYTHONS if os.access(path, os.X_OK)), None)
    if python is None:
        pytest.skip(f"no system python3 ({', '.join(_SYSTEM_PYTHONS)}) for the other user")
    return python


def _become(user: pwd.struct_passwd) -> Callable[[], None]:
    def drop() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    return drop


_OTHER_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/"}


@pytest.fixture
def as_other(other_user: pwd.struct_passwd) -> AsOther:
    """Run Python code as the other user (real uid and gid, no supplementary groups),
    with a system interpreter."""
    python = _system_python()

    def run(code: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [python, "-c", code, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_become(other_user),
            cwd="/",
            env=_OTHER_ENV,
            check=False,
        )

    return run


# A PostgreSQL impostor: answers every client with a request for its password in clear
# text and prints whatever the client sends back.
_IMPOSTOR = r"""
import socket, struct, sys

def exactly(conn, size):
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data

server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    with conn:
        try:
            while True:
                length, code = struct.unpack("!ii", exactly(conn, 8))
                if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: no
                    conn.sendall(b"N")
                    continue
                exactly(conn, length - 8)
                break
            conn.sendall(b"R" + struct.pack("!ii", 8, 3))  # AuthenticationCleartextPassword
            kind = exactly(conn, 1)
            (length,) = struct.unpack("!i", exactly(conn, 4))
            print("captured", kind, exactly(conn, length - 4), flush=True)
        except (EOFError, OSError):
            pass
"""


class Impostor:
    """A fake PostgreSQL the other user runs on 127.0.0.1:``port``: it asks each client
    for its password in clear text. ``captured()`` stops it and returns what it got."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port
        self._output: str | None = None

    def captured(self) -> str:
        """Stop the impostor (once); the lines it printed for what clients sent it."""
        if self._output is None:
            self.process.kill()
            self._output, _ = self.process.communicate()
        return self._output


@pytest.fixture
def impostor(other_user: pwd.struct_passwd) -> Iterator[Callable[[int], Impostor]]:
    """Start an Impostor, as the other user, on a port; stopped at teardown."""
    python = _system_python()
    started: list[Impostor] = []

    def start(port: int) -> Impostor:
        process = subprocess.Popen(
            [python, "-c", _IMPOSTOR, str(port)],
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=_become(other_user),
            cwd="/",
            env=_OTHER_ENV,
        )
        started.append(Impostor(process, port))
        # Its first line says it listens; only what clients sent it follows.
        assert process.stdout is not None and process.stdout.readline() == "listening\n"
        return started[-1]

    yield start
    for each in started:
        each.captured()


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


@pytest.fixture
def embedded_server(reachable_dir: Path) -> Iterator[LocalPostgres]:
    """The embedded server of `python -m app`, running in ``reachable_dir/regent``."""
    with embedded_postgres(reachable_dir / "regent", free_port()) as server:
        yield server


@pytest.fixture
def stopped_embedded_server(reachable_dir: Path) -> LocalPostgres:
    """An embedded server that ran once (its data directory and password exist) and is
    stopped now, as between two runs of `python -m app`."""
    with embedded_postgres(reachable_dir / "regent", free_port()) as server:
        return server


ADMIN_TOKEN = "security-admin-token-0123456789abcdef"
API_TOKEN = "security-api-token-0123456789abcdef"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
API = {"Authorization": f"Bearer {API_TOKEN}"}

Open = Callable[..., AbstractAsyncContextManager[httpx.AsyncClient]]


@pytest.fixture
def security_settings(settings: Settings) -> Settings:
    """The test settings with both tokens set."""
    return settings.model_copy(
        update={"ADMIN_TOKEN": SecretStr(ADMIN_TOKEN), "API_TOKEN": SecretStr(API_TOKEN)}
    )


@pytest.fixture
async def workspace(database: Database) -> int:
    """A workspace that credit grants may name."""
    async with database.engine.begin() as conn:
        await conn.execute(text("INSERT INTO workspaces (id, name) VALUES (1, 'Acme')"))
    return 1


async def _fails() -> None:
    raise RuntimeError("a route that fails")


@pytest.fixture
def open_app(security_settings: Settings) -> Open:
    """A worker of the default app (admin page and API, the example routes; no
    scheduler), its own app and state over the test database, as a client at
    ``client_ip``, served under ``root_path`` (as behind a proxy), with a route at
    ``failing_route`` that raises (a 500)."""

    @asynccontextmanager
    async def open_(
        client_ip: str = "203.0.113.7", root_path: str = "", failing_route: str | None = None
    ) -> AsyncIterator[httpx.AsyncClient]:
        jobs = build(security_settings)
        app = create_app(security_settings)
        app.include_router(jobs.router)
        if failing_route is not None:
            app.add_api_route(failing_route, _fails)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(
                app=app,
                client=(client_ip, 40000),
                root_path=root_path,
                raise_app_exceptions=False,
            )
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                yield client

    return open_


def serve_python_m_app(database_url: str, log: Path, **env: str) -> Iterator[int]:
    """`python -m app serve` on the test database, one worker, its output (uvicorn's
    access lines on stdout too) in ``log``; yields its port (use it as ``for port in``)."""
    port = free_port()
    environment = (
        os.environ
        | {
            "DATABASE_URL": database_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "BOOKING_REMINDERS_ENABLED": "false",
            "SUBSCRIPTIONS_ENABLED": "false",
            "UPDATES_CONSUMER_ENABLED": "false",
        }
        | env
    )
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--port", str(port), "--workers", "1"],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, log.read_text()[-800:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "python -m app did not answer"
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
