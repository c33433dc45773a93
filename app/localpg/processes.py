"""The server's process and its neighbours: ports, children, liveness."""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

from ..parent_death import set_parent_death_signal

__all__ = [
    "alive",
    "child_setup",
    "children_of",
    "free_port",
    "port_in_use",
    "user_name",
    "wait_gone",
]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def child_setup(account: pwd.struct_passwd | None, death_signal: int) -> Callable[[], None]:
    def setup() -> None:
        if account is not None:
            os.setgroups([])
            os.setgid(account.pw_gid)
            os.setuid(account.pw_uid)
        # Set after setuid: a credential change clears the parent-death signal.
        set_parent_death_signal(death_signal)

    return setup


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def alive(pid: int) -> bool:
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


def children_of(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(part) for part in text.split()]


def wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
