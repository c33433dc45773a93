"""An outbox as a whole, as operators act on it: every stuck row reset at once.

Shared by the admin API, the admin page and the CLI, as queries.py is; raises
AdminError subclasses whose messages name the problem.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.outbox import reset_stuck

from .queries import require_outbox

__all__ = ["reset_all_stuck"]


async def reset_all_stuck(
    engine: AsyncEngine, outbox: str, lease_now: datetime | None = None
) -> dict[str, Any]:
    """Make every stuck row of ``outbox`` pending, attempts 0 and due now, in one
    statement (app.outbox.reset_stuck), read on the lease clock (``lease_now`` as
    clock.lease_now gives it, None for the database server's). Returns ``reset``, the
    rows reset, and ``held``, the stuck rows another transaction held, left alone and
    never waited on. Raises NotFound for an unknown outbox."""
    await require_outbox(engine, outbox)
    done = await reset_stuck(engine, outbox, lease_now)
    return {"reset": done.reset, "held": done.held}
