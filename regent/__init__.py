"""Regent, imported by a project of one's own: ``from regent import create_app, ...``.

Regent's code is the package ``app`` (this repository's layout, installed beside this
one); ``regent`` is its name in a project whose own code is elsewhere. It first checks
that ``app`` is Regent's (app/_import_name.py: a project with a top-level ``app`` of
its own takes the name, and `import regent` then fails in one line naming both), then
re-exports what a project builds on. The same objects as under ``app``: ``regent.X is
app.<module>.X``. `python -m regent` is `python -m app`; ``regent.testing`` is the test
kit, and ``pytest_plugins = ["regent.testing.plugin"]`` its fixtures.
"""

import importlib.util
from pathlib import Path

# Loaded by its path: the name ``app``, which the check is about, may be another's.
_REGENTS_APP = Path(__file__).resolve().parent.parent / "app"
_spec = importlib.util.spec_from_file_location(
    "regent._import_name", _REGENTS_APP / "_import_name.py"
)
assert _spec is not None and _spec.loader is not None
_import_name = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_import_name)
_import_name.refuse_a_shadowed_app(_REGENTS_APP)

from app.db import Database as Database
from app.main import DatabaseDep as DatabaseDep
from app.main import create_app as create_app
from app.outbox import Deliver as Deliver
from app.outbox import Message as Message
from app.outbox import Outbox as Outbox
from app.outbox import PermanentDeliveryError as PermanentDeliveryError
from app.outbox import RetryableDeliveryError as RetryableDeliveryError
from app.scheduler import Clock as Clock
from app.scheduler import JobContext as JobContext
from app.scheduler import LeadershipLostError as LeadershipLostError
from app.scheduler import Scheduler as Scheduler
from app.scheduler import ServiceContext as ServiceContext
from app.scheduler import cron as cron
from app.scheduler import every as every
from app.settings import Settings as Settings

__all__ = [
    "Clock",
    "Database",
    "DatabaseDep",
    "Deliver",
    "JobContext",
    "LeadershipLostError",
    "Message",
    "Outbox",
    "PermanentDeliveryError",
    "RetryableDeliveryError",
    "Scheduler",
    "ServiceContext",
    "Settings",
    "create_app",
    "cron",
    "every",
]
