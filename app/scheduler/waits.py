"""Waiting on whichever of several things comes first (a sleep, a loss, a stop)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

__all__ = ["first"]


async def first(*awaitables: Awaitable[object]) -> int:
    """Await whichever finishes first, cancel the rest; return its index."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return next(index for index, task in enumerate(tasks) if task in done)
