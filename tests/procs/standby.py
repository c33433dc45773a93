"""A process that opens the lock connection and waits for the leader key, nothing else.

    python -m tests.procs.standby LOCK_DSN

Prints ``waiting`` once its connection is queued for the key (or ``leading`` once it
holds it), then waits until it is killed.
"""

import asyncio
import sys

from app.scheduler.election import LockConnection


async def main(dsn: str) -> None:
    lock = await LockConnection.connect(dsn, lease_seconds=30)
    if not await lock.try_acquire():
        print("waiting", flush=True)
        await lock.wait_acquire()
    print("leading", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
