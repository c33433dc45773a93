"""Statements carried to their end: an outcome write, a lease renewal or a service
copy's lease take that a cancel of the task that asked for it must not cut off.

A statement cut off mid-way loses its connection, and a lease taken as its taker was
cancelled would be held by nobody. So each runs in a task of its own, which the cancel
does not reach; ``Carried`` keeps those tasks from the garbage collector and lets the
runner wait for them all before the app disposes the engine (a statement still running
then would give its connection back to a disposed pool, which never closes it)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["Carried"]

T = TypeVar("T")


class Carried:
    """The statements of one process carried past the cancel of their callers."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def pending(self) -> list[asyncio.Task[Any]]:
        """The carried statements not yet ended."""
        return [task for task in self._tasks if not task.done()]

    def spawn(self, statement: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``statement`` to its end whatever happens to the task that asked for it;
        the caller may await the returned task through ``asyncio.shield``."""
        task = asyncio.ensure_future(statement)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task
