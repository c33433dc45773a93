"""Regent's test kit: test your own jobs and outboxes against a real PostgreSQL.

In ``conftest.py``: ``pytest_plugins = ["app.testing.plugin"]``; then, in a test::

    from app.testing import run_job

    async def test_reminder_is_sent_once(regent_database):
        record = await run_job(scheduler, "booking_reminders", database=regent_database)
        assert record.status == "ok"

``run_job`` fires one slot through the real claim and runner; ``drain`` runs one pass
of an outbox; ``RecordingReceiver`` stands in for the system an outbox delivers to;
``terminate_leader_connection`` and the server's ``restart()``/``crash()`` are faults.
"""

from app.scheduler import FakeClock

from .faults import terminate_leader_connection
from .outbox import RecordingReceiver, drain
from .runs import RunRecord, run_job
from .server import TestServer, start_test_server

__all__ = [
    "FakeClock",
    "RecordingReceiver",
    "RunRecord",
    "TestServer",
    "drain",
    "run_job",
    "start_test_server",
    "terminate_leader_connection",
]
