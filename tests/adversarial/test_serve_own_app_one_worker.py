"""`python -m app --app mypkg.main:app --workers 1` serves the user's app on the
embedded database, as it does with two workers."""

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from app.localpg import free_port

# The README's shape: create_app() at import, settings read from the environment.
USER_APP = """
from app.main import create_app
from app.scheduler import JobContext, Scheduler, every

scheduler = Scheduler()


@scheduler.job(every(hours=1), id="user_job")
async def user_job(ctx: JobContext) -> None:
    return None


app = create_app(scheduler=scheduler)


@app.get("/hello")
async def hello() -> dict[str, str]:
    return {"from": "mypkg"}
"""


def test_python_m_app_serves_a_users_own_app_with_one_worker() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="regent-adv-one-worker-"))
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "main.py").write_text(USER_APP)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    tmp_path.chmod(0o755)
    data_dir.chmod(0o755)
    http_port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env |= {
        "REGENT_DATA_DIR": str(data_dir),
        "REGENT_PG_PORT": str(free_port()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")])),
    }
    log = tmp_path / "stderr.txt"
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "app",
                "--app",
                "mypkg.main:app",
                "--workers",
                "1",
                "--port",
                str(http_port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"python -m app --app exited: {log.read_text()[-600:]}"
            try:
                answer = httpx.get(f"http://127.0.0.1:{http_port}/hello")
                if answer.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the user's app did not answer"
            time.sleep(0.1)
        assert answer.json() == {"from": "mypkg"}
    finally:
        process.terminate()
        process.wait(60)
        subprocess.run(["rm", "-rf", str(tmp_path)], check=False)
