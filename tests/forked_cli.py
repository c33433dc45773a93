"""`python -m app ARGS` run to its end in a process of its own, forked from one that
has imported the app already.

A command run so is what a shell runs: its own process, the environment it is given,
its stdout and stderr apart, its exit status, a signal that ends it. What it skips is
the second or so of imports every new interpreter pays for `python -m app` (a quarter
of the parallel lane's CPU when each of these tests started one). A test about what
happens on import, from another directory, or in a long-running server starts a new
interpreter instead (``subprocess``), as before.

The forking process (``serve``, run by ``python -c``) reads one request per line on its
stdin (JSON: argv, env, timeout), forks, and answers one line: the exit status, or that
the timeout passed (the command's process group is killed then). The command's output
goes through files, so a command that writes a lot never blocks on a pipe.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["run_app"]


def run_app(
    args: list[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m app *args` with exactly ``env`` as its environment, from this
    process's directory; its output captured as text, as ``subprocess.run(...,
    capture_output=True, text=True, check=False)`` gives it. Raises
    subprocess.TimeoutExpired when it runs past ``timeout`` seconds (it is killed)."""
    return _forker().run(args, env, timeout)


class _Forker:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outputs = Path(tempfile.mkdtemp(prefix="regent-forked-cli-"))
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from tests.forked_cli import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path.cwd(),
        )
        atexit.register(self.close)

    def run(
        self, args: list[str], env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        stdout, stderr = self._outputs / "stdout", self._outputs / "stderr"
        request = {"argv": args, "env": env, "timeout": timeout}
        request |= {"stdout": str(stdout), "stderr": str(stderr)}
        with self._lock:
            assert self._process.stdin is not None and self._process.stdout is not None
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            answer = json.loads(self._process.stdout.readline())
            command = [sys.executable, "-m", "app", *args]
            out, err = stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
        if answer["timed_out"]:
            raise subprocess.TimeoutExpired(command, timeout, out, err)
        return subprocess.CompletedProcess(command, answer["status"], out, err)

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            self._process.wait(10)
        subprocess.run(["rm", "-rf", str(self._outputs)], check=False)


_started: list[_Forker] = []


def _forker() -> _Forker:
    if not _started:
        _started.append(_Forker())
    return _started[0]


def serve() -> None:
    """The forking process: import the app once, then run each request in a child."""
    from app import __main__ as entry

    for line in sys.stdin:
        request: dict[str, Any] = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _command(entry.main, entry.__file__, request)
        status, timed_out = _wait(pid, request["timeout"])
        print(json.dumps({"status": status, "timed_out": timed_out}), flush=True)


def _command(main: Callable[[], int], main_file: str, request: dict[str, Any]) -> NoReturn:
    """In the child: become `python -m app ARGV`, run it, exit with its status."""
    status = 1
    try:
        os.setpgid(0, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = [main_file, *request["argv"]]
        status = _exit_status(main)
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def _exit_status(main: Callable[[], int]) -> int:
    # What the interpreter makes of `sys.exit(main())` and of what escapes it.
    try:
        code: object = main()
    except SystemExit as exc:
        code = exc.code
    except KeyboardInterrupt:
        traceback.print_exc()
        return 128 + signal.SIGINT
    except BaseException:
        traceback.print_exc()
        return 1
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _wait(pid: int, timeout: float) -> tuple[int, bool]:
    pidfd = os.pidfd_open(pid)
    try:
        ready, _, _ = select.select([pidfd], [], [], timeout)
    finally:
        os.close(pidfd)
    if not ready:
        os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), not ready
