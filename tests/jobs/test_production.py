"""In production the app refuses a logging gateway: it would record charges as
succeeded and reminders as sent without doing either. A disabled job needs none."""

from __future__ import annotations

import pytest

from app.jobs import JobDeps, LoggingGatewayInProductionError, build
from app.jobs.gateways import LoggingPaymentProvider, LoggingSmsGateway, NoUpdates
from app.settings import Settings

from .conftest import FakePayments, FakeSms, FakeUpdates

# (dependency, its logging default, the job that uses it, the setting that disables it)
USES = [
    ("sms", LoggingSmsGateway, "booking_reminders", "BOOKING_REMINDERS_ENABLED"),
    ("payments", LoggingPaymentProvider, "subscription_charges", "SUBSCRIPTIONS_ENABLED"),
    ("updates", NoUpdates, "updates_consumer", "UPDATES_CONSUMER_ENABLED"),
]


def _real_deps() -> JobDeps:
    return JobDeps(sms=FakeSms(), payments=FakePayments(), updates=FakeUpdates([]))


@pytest.fixture
def production(settings: Settings) -> Settings:
    return settings.model_copy(update={"ENVIRONMENT": "production"})


def _registered(settings: Settings, deps: JobDeps) -> set[str]:
    scheduler = build(settings, deps).scheduler
    return set(scheduler.jobs) | set(scheduler.services)


@pytest.mark.parametrize(("dep", "logging_default", "job", "switch"), USES)
def test_production_refuses_a_logging_gateway_naming_both_fixes(
    production: Settings, dep: str, logging_default: type, job: str, switch: str
) -> None:
    deps = _real_deps()
    setattr(deps, dep, logging_default())
    with pytest.raises(LoggingGatewayInProductionError) as raised:
        build(production, deps)
    message = str(raised.value)
    assert "\n" not in message
    for named in ("ENVIRONMENT=production", logging_default.__name__, job, "JobDeps(", switch):
        assert named in message


def test_production_names_every_logging_gateway_at_once(production: Settings) -> None:
    with pytest.raises(LoggingGatewayInProductionError) as raised:
        build(production)
    for _, logging_default, _, switch in USES:
        assert logging_default.__name__ in str(raised.value)
        assert switch in str(raised.value)


@pytest.mark.parametrize(("dep", "logging_default", "job", "switch"), USES)
def test_production_starts_with_a_logging_gateway_whose_job_is_disabled(
    production: Settings, dep: str, logging_default: type, job: str, switch: str
) -> None:
    deps = _real_deps()
    setattr(deps, dep, logging_default())
    registered = _registered(production.model_copy(update={switch: False}), deps)
    assert job not in registered
    assert {j for _, _, j, _ in USES} - {job} <= registered


def test_production_with_real_gateways_runs_every_job(production: Settings) -> None:
    assert {job for _, _, job, _ in USES} <= _registered(production, _real_deps())


def test_development_runs_every_job_on_the_logging_gateways(settings: Settings) -> None:
    development = settings.model_copy(update={"ENVIRONMENT": "development"})
    assert {job for _, _, job, _ in USES} <= _registered(development, JobDeps())
