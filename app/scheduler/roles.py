"""One worker's role, and waiting for it to become one of several."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .config import Role

__all__ = ["RoleState"]


class RoleState:
    """The role of one worker. Only its supervisor sets it; any part may wait on it."""

    def __init__(self) -> None:
        self.role = Role.STARTING
        self._changed = asyncio.Condition()

    async def set(self, role: Role) -> bool:
        """Make ``role`` the worker's and wake whoever waits; True when it changed."""
        async with self._changed:
            changed = role is not self.role
            self.role = role
            self._changed.notify_all()
        return changed

    async def until(self, holds: Callable[[Role], bool]) -> Role:
        """Return the role once ``holds`` is true of it."""
        async with self._changed:
            await self._changed.wait_for(lambda: holds(self.role))
            return self.role
