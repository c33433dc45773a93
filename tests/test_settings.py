"""Settings: defaults, derived URLs, and errors that name the variable and the fix."""

import pytest

from app.db import async_url, asyncpg_dsn, sync_url
from app.settings import SettingsError, load_settings


def test_lock_database_url_defaults_to_database_url() -> None:
    settings = load_settings(_env_file=None, DATABASE_URL="postgresql://u:p@db:5432/app")
    assert settings.lock_database_url == "postgresql://u:p@db:5432/app"


def test_lock_database_url_may_point_past_a_pooler() -> None:
    settings = load_settings(
        _env_file=None,
        DATABASE_URL="postgresql://u:p@pooler:6432/app",
        LOCK_DATABASE_URL="postgresql://u:p@db:5432/app",
    )
    assert settings.lock_database_url == "postgresql://u:p@db:5432/app"


@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_hosting_provider_urls_give_both_drivers(scheme: str) -> None:
    url = f"{scheme}://user:s3cr%40t@host.example:5433/app?sslmode=require"
    load_settings(_env_file=None, DATABASE_URL=url)
    assert async_url(url).startswith("postgresql+asyncpg://user:s3cr%40t@host.example:5433/app")
    assert sync_url(url).startswith("postgresql+psycopg://user:s3cr%40t@host.example:5433/app")
    assert asyncpg_dsn(url).startswith("postgresql://user:s3cr%40t@host.example:5433/app")


def test_bad_environment_names_the_variable_and_choices() -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(_env_file=None, ENVIRONMENT="prod")
    message = str(raised.value)
    assert "ENVIRONMENT='prod'" in message
    assert "development" in message and "production" in message


def test_non_postgres_url_is_refused_without_echoing_it() -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(_env_file=None, DATABASE_URL="mysql://root:hunter2@db/app")
    assert "DATABASE_URL" in str(raised.value)
    assert "hunter2" not in str(raised.value)


def test_unknown_timezone_is_refused() -> None:
    with pytest.raises(SettingsError, match="TIMEZONE='Mars/Olympus'"):
        load_settings(_env_file=None, TIMEZONE="Mars/Olympus")


def test_a_timezone_that_is_the_hosts_own_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"TIMEZONE='localtime'.*not a place"):
        load_settings(_env_file=None, TIMEZONE="localtime")


def test_leader_tick_must_fit_twice_in_the_lease() -> None:
    with pytest.raises(SettingsError, match="LEADER_TICK_SECONDS"):
        load_settings(_env_file=None, LEASE_SECONDS=6, LEADER_TICK_SECONDS=5)


def test_a_claim_lead_of_more_than_a_quarter_of_the_lease_is_refused() -> None:
    with pytest.raises(SettingsError, match="CLAIM_AHEAD_SECONDS must be at most a quarter"):
        load_settings(_env_file=None, LEASE_SECONDS=8, LEADER_TICK_SECONDS=1, CLAIM_AHEAD_SECONDS=3)


def test_the_default_claim_lead_fits_the_shortest_lease() -> None:
    settings = load_settings(_env_file=None, LEASE_SECONDS=2, LEADER_TICK_SECONDS=1)
    assert settings.CLAIM_AHEAD_SECONDS * 4 <= settings.LEASE_SECONDS


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVIRONMENT", "production")
    monkeypatch.setenv("LOG_LEVEL", "DEBUG")
    settings = load_settings(_env_file=None)
    assert settings.is_production
    assert settings.LOG_LEVEL == "DEBUG"


TIMING_SETTINGS = [
    "LEASE_SECONDS",
    "LEADER_TICK_SECONDS",
    "HANDOVER_GRACE_SECONDS",
    "SHUTDOWN_GRACE_SECONDS",
    "CLAIM_AHEAD_SECONDS",
    "DATABASE_CONNECT_TIMEOUT_SECONDS",
    "CHARGE_CLAIM_COOLDOWN_SECONDS",
    "REPORT_WARM_INTERVAL_MINUTES",
    "TRACKING_EVENT_RETENTION_DAYS",
    "OUTBOX_MAX_ATTEMPTS",
]


@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e300", "99999999999"])
@pytest.mark.parametrize("name", TIMING_SETTINGS)
def test_every_timing_setting_refuses_infinite_and_huge_values(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as raised:
        load_settings(_env_file=None)
    assert name in str(raised.value)


@pytest.mark.parametrize(
    "url", ["ftp://host/grants", "file:///etc/passwd", "grants.example/x", "http://"]
)
def test_credit_grants_url_must_be_http_or_https(url: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(_env_file=None, CREDIT_GRANTS_URL=url)
    assert "CREDIT_GRANTS_URL" in str(raised.value)
    assert "http" in str(raised.value)


def test_an_https_credit_grants_url_is_accepted() -> None:
    url = "https://grants.example/v1/grants"
    assert url == load_settings(_env_file=None, CREDIT_GRANTS_URL=url).credit_grants_url


@pytest.mark.parametrize("token", ["", "   ", "\t\n", "short-token-15c", "x" * 31])
def test_admin_token_refuses_empty_blank_and_short_values(token: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(_env_file=None, ADMIN_TOKEN=token)
    message = str(raised.value)
    assert "ADMIN_TOKEN" in message and "32" in message
    if token.strip():
        assert token not in message, "the token itself is never echoed"


def test_admin_token_of_32_characters_is_accepted() -> None:
    settings = load_settings(_env_file=None, ADMIN_TOKEN="0123456789abcdef" * 2)
    assert settings.ADMIN_TOKEN is not None


def test_no_url_setting_shows_its_password_in_repr_or_str_but_the_code_gets_it() -> None:
    settings = load_settings(
        _env_file=None,
        DATABASE_URL="postgresql://app:db-pass-1@db:5432/app",
        LOCK_DATABASE_URL="postgresql://app:lock-pass-2@db:5432/app",
        CREDIT_GRANTS_URL="https://grants:grants-pass-3@receiver.example/grants?token=tok-4",
    )
    shown = repr(settings) + str(settings)
    shown += "".join(
        repr(value) + str(value) + f"{value}"
        for value in (settings.DATABASE_URL, settings.LOCK_DATABASE_URL, settings.CREDIT_GRANTS_URL)
    )
    for secret in ("db-pass-1", "lock-pass-2", "grants-pass-3", "tok-4"):
        assert secret not in shown
    assert "db:5432/app" in shown and "receiver.example/grants" in shown
    assert settings.database_url == "postgresql://app:db-pass-1@db:5432/app"
    assert settings.lock_database_url == "postgresql://app:lock-pass-2@db:5432/app"
    assert settings.credit_grants_url == (
        "https://grants:grants-pass-3@receiver.example/grants?token=tok-4"
    )
