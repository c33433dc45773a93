"""`python -m app`: the embedded default end to end, and clean errors."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.localpg import free_port


def _run(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_bad_setting_exits_with_the_variable_named() -> None:
    result = _run(["migrate"], {"ENVIRONMENT": "prod"})
    assert result.returncode == 2
    assert "ENVIRONMENT='prod'" in result.stderr
    assert "Traceback" not in result.stderr


# A real process whose time is the guarantee: the real-processes lane (took 28 s beside
# the first lane at load 9-10, within 10 s alone).
@pytest.mark.multiprocess
def test_unreachable_database_fails_fast_naming_host_and_port() -> None:
    port = free_port()
    started = time.monotonic()
    result = _run(["serve"], {"DATABASE_URL": f"postgresql://u:p@127.0.0.1:{port}/app"})
    assert time.monotonic() - started < 10
    assert result.returncode == 2
    assert f"127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def _descendants(pid: int) -> set[int]:
    found: set[int] = set()
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found.add(child)
            pending.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return ") Z " not in stat


@dataclass
class EmbeddedApp:
    process: subprocess.Popen[str]
    data_dir: Path
    http_port: int
    env: dict[str, str]


@contextlib.contextmanager
def _embedded_app() -> Iterator[EmbeddedApp]:
    """`python -m app` with no DATABASE_URL, serving on a free port, until it answers."""
    data_dir = Path(tempfile.mkdtemp(prefix="regent-embedded-"))
    data_dir.chmod(0o755)
    http_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {"REGENT_DATA_DIR": str(data_dir), "REGENT_PG_PORT": str(free_port())}
    log = data_dir / "app.log"
    with open(log, "w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "app", "--port", str(http_port), "--workers", "2"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    app = EmbeddedApp(process, data_dir, http_port, env)
    try:
        # Start-up (initdb, a server, the workers' imports) is not what these tests
        # bound; beside the parallel lane on two loaded cores it has taken 70 s.
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{http_port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "embedded app did not become ready"
            time.sleep(0.1)
        yield app
    finally:
        if process.poll() is None:
            # A clean stop; test_a_killed_app_leaves_no_worker_and_restarts_at_once
            # covers SIGKILL.
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        subprocess.run(["rm", "-rf", str(data_dir)], check=False)


@pytest.fixture
def embedded_app() -> Iterator[EmbeddedApp]:
    """An embedded app of the test's own, which the test may stop, kill or restart."""
    with _embedded_app() as app:
        yield app


# The tests of running_embedded_app run on one worker (pyproject's --dist loadgroup),
# so the app starts once, not once on each worker that draws one of them.
_SHARES_THE_RUNNING_APP = pytest.mark.xdist_group("running_embedded_app")


@pytest.fixture(scope="module")
def running_embedded_app() -> Iterator[EmbeddedApp]:
    """One embedded app for the tests that only read from it or ask it something (its
    start-up, initdb and two workers, is most of a test's time): none stops it, kills a
    worker or writes through it."""
    with _embedded_app() as app:
        yield app


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_embedded_app_stops_on_a_signal_and_leaves_no_process(
    embedded_app: EmbeddedApp, stop_signal: signal.Signals
) -> None:
    tree = _descendants(embedded_app.process.pid)
    assert len(tree) >= 3, "expected uvicorn workers and a postmaster"
    embedded_app.process.send_signal(stop_signal)
    embedded_app.process.wait(60)
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in tree if _alive(pid)]


@_SHARES_THE_RUNNING_APP
def test_second_run_on_the_same_data_directory_is_refused(
    running_embedded_app: EmbeddedApp,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "--port", str(free_port())],
        env=running_embedded_app.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "in use by `python -m app`" in result.stderr
    assert running_embedded_app.process.poll() is None


@_SHARES_THE_RUNNING_APP
def test_metrics_are_aggregated_across_workers(running_embedded_app: EmbeddedApp) -> None:
    url = f"http://127.0.0.1:{running_embedded_app.http_port}/metrics"
    deadline = time.monotonic() + 20
    while "regent_is_leader 1.0" not in httpx.get(url).text:
        assert time.monotonic() < deadline, "no leader reported"
        time.sleep(0.05)
    # Fresh connections land on both workers; the standby must report the leader too.
    bodies = [httpx.get(url, headers={"Connection": "close"}).text for _ in range(10)]
    assert all("regent_is_leader 1.0" in body for body in bodies)
    assert all("regent_event_loop_lag_seconds" in body for body in bodies)


def _promoted_pids(embedded_app: EmbeddedApp) -> list[int]:
    log = (embedded_app.data_dir / "app.log").read_text(errors="replace")
    return [int(pid) for pid in re.findall(r"scheduler\.promoted \(pid=(\d+)", log)]


def test_metrics_count_one_leader_after_the_leader_worker_is_killed(
    embedded_app: EmbeddedApp,
) -> None:
    url = f"http://127.0.0.1:{embedded_app.http_port}/metrics"
    deadline = time.monotonic() + 20
    while "regent_is_leader 1.0" not in httpx.get(url).text or not _promoted_pids(embedded_app):
        assert time.monotonic() < deadline, "no leader reported"
        time.sleep(0.05)
    killed = _promoted_pids(embedded_app)[-1]
    os.kill(killed, signal.SIGKILL)
    while _promoted_pids(embedded_app)[-1] == killed:
        assert time.monotonic() < deadline + 20, "no worker took over"
        time.sleep(0.05)
    # Every worker that answers must count exactly one live leader, for good.
    while True:
        bodies = [httpx.get(url, headers={"Connection": "close"}).text for _ in range(10)]
        if all("regent_is_leader 1.0" in body for body in bodies):
            break
        assert time.monotonic() < deadline + 40, [
            line for line in bodies[-1].splitlines() if line.startswith("regent_is_leader")
        ]
        time.sleep(0.1)


def test_a_killed_app_leaves_no_worker_and_restarts_at_once(embedded_app: EmbeddedApp) -> None:
    tree = _descendants(embedded_app.process.pid)
    metrics_dirs = set(
        Path(tempfile.gettempdir()).glob(f"regent-metrics-{embedded_app.process.pid}-*")
    )
    assert metrics_dirs, "python -m app made no metrics directory"
    embedded_app.process.kill()
    embedded_app.process.wait(10)
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in tree):
        assert time.monotonic() < deadline, [pid for pid in tree if _alive(pid)]
        time.sleep(0.05)
    restarted = subprocess.Popen(
        [sys.executable, "-m", "app", "--port", str(embedded_app.http_port), "--workers", "2"],
        env=embedded_app.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            assert restarted.poll() is None, "the restart failed (port or data directory taken)"
            try:
                url = f"http://127.0.0.1:{embedded_app.http_port}/readyz"
                if httpx.get(url).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline + 60, "the restarted app did not become ready"
            time.sleep(0.1)
        assert not any(path.exists() for path in metrics_dirs)
    finally:
        restarted.terminate()
        restarted.wait(60)


@_SHARES_THE_RUNNING_APP
def test_start_up_says_the_admin_page_is_off_without_a_token(
    running_embedded_app: EmbeddedApp,
) -> None:
    log = (running_embedded_app.data_dir / "app.log").read_text(errors="replace")
    assert "admin page off: ADMIN_TOKEN is unset" in log


def test_start_up_names_the_admin_page_url_with_a_token() -> None:
    from pydantic import SecretStr

    from app.__main__ import admin_page_note
    from app.settings import Settings

    settings = Settings(_env_file=None, ADMIN_TOKEN=SecretStr("0123456789abcdef" * 2))  # type: ignore[call-arg]
    assert admin_page_note(settings, "127.0.0.1", 8000) == (
        "regent: admin page at http://127.0.0.1:8000/admin"
    )


@_SHARES_THE_RUNNING_APP
def test_operator_commands_reach_the_running_embedded_server(
    running_embedded_app: EmbeddedApp,
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app", "jobs"],
        env=running_embedded_app.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # The first line names the schedule the table is of (SCHEDULER_NAME).
    assert result.stdout.startswith("schedule default\nid "), result.stdout
