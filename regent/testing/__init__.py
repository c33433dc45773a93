"""Regent's test kit (``app.testing``) under the ``regent`` name: run a job's slot, drain
an outbox, fake the clock, fault the leader. Its fixtures: ``pytest_plugins =
["regent.testing.plugin"]`` in your top-level ``conftest.py``."""

from app.testing import FakeClock as FakeClock
from app.testing import RecordingReceiver as RecordingReceiver
from app.testing import RunRecord as RunRecord
from app.testing import TestServer as TestServer
from app.testing import drain as drain
from app.testing import run_job as run_job
from app.testing import start_test_server as start_test_server
from app.testing import terminate_leader_connection as terminate_leader_connection

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
