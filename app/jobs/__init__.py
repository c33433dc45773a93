"""The app's own jobs: one module per piece of real work, each a worked example of an
idempotency pattern (see each module's docstring).

``build(settings, deps)`` registers them on a new Scheduler and returns it with the
routes that go with them; ``app.main:app`` uses it. The routes answer only to
``Authorization: Bearer <API_TOKEN>`` (404 while API_TOKEN is unset; see api_token.py).
Systems outside the app (SMS, payments, a bot's updates) come in through ``JobDeps``;
the defaults only log, so with ENVIRONMENT=production ``build`` refuses them for every
job that is enabled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastapi import APIRouter, Depends, Security

from app.admin.auth import bearer_scheme, guard_responses
from app.outbox import Outbox
from app.scheduler import Scheduler
from app.settings import Settings, SettingsError

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
from .api_token import require_api_token
from .gateways import (
    LOGGING_ONLY,
    LoggingPaymentProvider,
    LoggingSmsGateway,
    NoUpdates,
    PaymentProvider,
    SmsGateway,
    UpdatesSource,
)

__all__ = [
    "DEMO_MIGRATIONS",
    "AppJobs",
    "JobDeps",
    "LoggingGatewayInProductionError",
    "build",
    "refuse_logging_gateways",
    "require_the_demos_tables",
]

DEMO_MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
"""The demo jobs' tables: this repository's own migrations, beside the package in a
checkout. An installed Regent (a wheel) does not carry them."""


def require_the_demos_tables() -> None:
    """Return when the demo's migrations are there to make its tables (a checkout of
    this repository); raise SettingsError naming the fix otherwise: served from an
    installed Regent, the demo would fire into a database without its tables (and
    query a user's own ``bookings`` or ``subscriptions``)."""
    if not (DEMO_MIGRATIONS / "env.py").is_file():
        raise SettingsError(
            "the built-in app (app.main:app) is the demo of Regent's repository, and its "
            f"tables are that repository's migrations/ (not at {DEMO_MIGRATIONS}: an "
            "installed Regent does not carry them); serve your own app with --app "
            "mypkg.main:app, or REGENT_APP=mypkg.main:app"
        )


@dataclass
class JobDeps:
    """The outside systems the jobs use."""

    sms: SmsGateway = field(default_factory=LoggingSmsGateway)
    payments: PaymentProvider = field(default_factory=LoggingPaymentProvider)
    updates: UpdatesSource = field(default_factory=NoUpdates)


# (JobDeps field, the job that uses it, the setting that disables that job)
_USES = (
    ("sms", "booking_reminders", "BOOKING_REMINDERS_ENABLED"),
    ("payments", "subscription_charges", "SUBSCRIPTIONS_ENABLED"),
    ("updates", "updates_consumer", "UPDATES_CONSUMER_ENABLED"),
)


class LoggingGatewayInProductionError(SettingsError):
    """ENVIRONMENT=production and an enabled job would use a development gateway that
    only logs; ``problems`` says which job, which gateway and the two fixes."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(
            "ENVIRONMENT=production, but "
            + "; ".join(problems)
            + ": a logging gateway records charges as succeeded and reminders as sent "
            "without doing either"
        )


def refuse_logging_gateways(settings: Settings, deps: JobDeps) -> None:
    """Raise LoggingGatewayInProductionError when ENVIRONMENT=production and an enabled
    job would use one of the logging defaults; return otherwise."""
    if not settings.is_production:
        return
    problems = [
        f"{job} would use {type(gateway).__name__} (pass a real one as "
        f"JobDeps({dep}=...), or set {switch}=false)"
        for dep, job, switch in _USES
        if getattr(settings, switch) and isinstance(gateway := getattr(deps, dep), LOGGING_ONLY)
    ]
    if problems:
        raise LoggingGatewayInProductionError(problems)


@dataclass
class AppJobs:
    """The scheduler with every job, the outboxes, and the routes."""

    scheduler: Scheduler
    credit_grants: Outbox
    router: APIRouter


def build(settings: Settings, deps: JobDeps | None = None) -> AppJobs:
    """Register every enabled job of the app on a new Scheduler.

    Raises LoggingGatewayInProductionError (see refuse_logging_gateways).
    """
    deps = deps or JobDeps()
    refuse_logging_gateways(settings, deps)
    scheduler = Scheduler()
    if settings.BOOKING_REMINDERS_ENABLED:
        booking_reminders.register(scheduler, deps.sms)
    standing_orders.register(scheduler)
    if settings.SUBSCRIPTIONS_ENABLED:
        subscriptions.register(scheduler, deps.payments, settings.CHARGE_CLAIM_COOLDOWN_SECONDS)
    reservations.register(scheduler)
    retention.register(scheduler, settings.TRACKING_EVENT_RETENTION_DAYS)
    if settings.REPORT_WARM_ENABLED:
        report_warm.register(scheduler, settings.REPORT_WARM_INTERVAL_MINUTES)
    if settings.UPDATES_CONSUMER_ENABLED:
        updates_consumer.register(scheduler, deps.updates)
    grants, grants_router = credit_grants.build(settings, scheduler)
    # They move money and read any workspace: never open, and off until configured.
    router = APIRouter(
        dependencies=[Security(bearer_scheme("API_TOKEN")), Depends(require_api_token)],
        responses=guard_responses("API_TOKEN"),
    )
    router.include_router(grants_router)
    router.include_router(report_warm.router)
    return AppJobs(scheduler, grants, router)
