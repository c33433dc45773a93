"""Begin the scheduler's stop the moment the worker is told to stop.

uvicorn notices SIGTERM and SIGINT on its next 0.1 s tick and runs the lifespan's
shutdown only after the HTTP side has closed, so ``scheduler.stop()`` comes tens of
milliseconds (or a whole drain) after the signal. When every worker is stopped at once
(Ctrl-C, a deploy), the old leader releases the key in that gap and a standby that is
itself stopping would promote, then demote. The handler installed here asks the
scheduler to stop at once, then hands the signal on to the server's own handler.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Callable
from types import FrameType

__all__ = ["STOP_SIGNALS", "on_stop_signal"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def on_stop_signal(begin_stop: Callable[[], None]) -> Callable[[], None]:
    """Run ``begin_stop`` on the running loop when SIGINT or SIGTERM arrives, before
    the handler that was installed (the server's) runs; return the function that puts
    that handler back.

    Only the main thread may install signal handlers: elsewhere (a test client's
    thread) it installs nothing and the returned function does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def handler(sig: int, frame: FrameType | None) -> None:
        # A signal handler may interrupt the loop mid-step: schedule, never call.
        loop.call_soon_threadsafe(begin_stop)
        chained = previous[signal.Signals(sig)]
        if callable(chained):
            chained(sig, frame)
        elif chained == signal.SIG_DFL:
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)

    for sig in STOP_SIGNALS:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, handler_before in previous.items():
            # None: a handler installed outside Python, which Python cannot put back.
            signal.signal(sig, signal.SIG_DFL if handler_before is None else handler_before)

    return restore
