"""The app's own jobs: one module per piece of real work, each a worked example of an
idempotency pattern (see each module's docstring).

``build(settings, deps)`` registers them on a new Scheduler and returns it with the
routes that go with them; ``app.main:app`` uses it. Systems outside the app (SMS,
payments, a bot's updates) come in through ``JobDeps``; the defaults only log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import APIRouter

from app.outbox import Outbox
from app.scheduler import Scheduler
from app.settings import Settings

from . import (
    booking_reminders,
    credit_grants,
    report_warm,
    reservations,
    retention,
    standing_orders,
    subscriptions,
    updates_consumer,
)
from .gateways import (
    LoggingPaymentProvider,
    LoggingSmsGateway,
    NoUpdates,
    PaymentProvider,
    SmsGateway,
    UpdatesSource,
)

__all__ = ["AppJobs", "JobDeps", "build"]


@dataclass
class JobDeps:
    """The outside systems the jobs use."""

    sms: SmsGateway = field(default_factory=LoggingSmsGateway)
    payments: PaymentProvider = field(default_factory=LoggingPaymentProvider)
    updates: UpdatesSource = field(default_factory=NoUpdates)


@dataclass
class AppJobs:
    """The scheduler with every job, the outboxes, and the routes."""

    scheduler: Scheduler
    credit_grants: Outbox
    router: APIRouter


def build(settings: Settings, deps: JobDeps | None = None) -> AppJobs:
    """Register every job of the app on a new Scheduler."""
    deps = deps or JobDeps()
    scheduler = Scheduler()
    booking_reminders.register(scheduler, deps.sms)
    standing_orders.register(scheduler)
    subscriptions.register(scheduler, deps.payments, settings.CHARGE_CLAIM_COOLDOWN_SECONDS)
    reservations.register(scheduler)
    retention.register(scheduler, settings.TRACKING_EVENT_RETENTION_DAYS)
    if settings.REPORT_WARM_ENABLED:
        report_warm.register(scheduler, settings.REPORT_WARM_INTERVAL_MINUTES)
    updates_consumer.register(scheduler, deps.updates)
    grants, grants_router = credit_grants.build(settings, scheduler)
    router = APIRouter()
    router.include_router(grants_router)
    router.include_router(report_warm.router)
    return AppJobs(scheduler, grants, router)
