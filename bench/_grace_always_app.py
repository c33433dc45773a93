"""The probe app as it was before a new leader could skip the handover grace: every
promotion waits the whole HANDOVER_GRACE_SECONDS, whether or not the previous leader's
backend is gone. bench/failover.py runs it beside the shipped behaviour, in the same
run; nothing else imports it."""

from app.scheduler.election import LockConnection
from tests.procs.probe_app import app


async def _never_proven_gone(self: LockConnection, timeout: float) -> bool:
    return False


# A bench-only baseline: the one behaviour the comparison switches off.
LockConnection.previous_leader_gone = _never_proven_gone  # type: ignore[method-assign]

__all__ = ["app"]
