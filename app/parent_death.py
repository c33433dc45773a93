"""Die with the parent: a child process that must not outlive the process that started it.

Linux's ``PR_SET_PDEATHSIG`` asks the kernel to signal us when our parent exits, however
it exits (kill -9 included). Used for the embedded PostgreSQL and for uvicorn workers,
so a SIGKILLed ``python -m app`` leaves no server and no worker holding the port.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys

__all__ = ["set_parent_death_signal", "worker_dies_with_parent"]

_PR_SET_PDEATHSIG = 1
# Loaded once here, not after a fork: a preexec hook must not take the loader's lock.
_LIBC = (
    ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if sys.platform.startswith("linux")
    else None
)


def set_parent_death_signal(death_signal: int) -> None:
    """Have the kernel send ``death_signal`` to this process when its parent exits.

    A no-op off Linux. A credential change (setuid) clears it: call it after one.
    """
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, death_signal, 0, 0, 0)


def worker_dies_with_parent() -> None:
    """In a uvicorn worker (a multiprocessing child), stop gracefully with SIGTERM when
    the supervising process dies. Does nothing in a single-process server."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent.pid:
        # The parent died before the kernel could be told: stop now.
        os.kill(os.getpid(), signal.SIGTERM)
