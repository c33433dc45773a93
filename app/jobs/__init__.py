"""The app's own jobs, each in a module of its own, all on one Scheduler.

``app.main:app`` runs this scheduler. A module here registers its job with
``@scheduler.job(...)`` and is imported below so that registration happens at start.
"""

from app.scheduler import Scheduler

__all__ = ["scheduler"]

scheduler = Scheduler()
