"""Every knob the app reads, with its default and its environment name.

Settings are built once, by :func:`load_settings` (or by a test passing values), and
handed down; nothing reads ``os.environ`` for configuration anywhere else.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from .project import dot_env_files
from .scheduler.keys import validate_schedule_name
from .scheduler.triggers import zone_named
from .secret_url import SecretUrl

__all__ = ["ADMIN_TOKEN_MIN_LENGTH", "Settings", "SettingsError", "load_settings"]

_POSTGRES_SCHEMES = ("postgres", "postgresql")
# Query parameters both drivers understand (db.py maps sslmode to asyncpg's ssl; host
# and port name a Unix socket, as the embedded server's URL does); any other would
# reach asyncpg.connect() as an unknown keyword and fail at the first query.
_URL_PARAMETERS = ("sslmode", "target_session_attrs", "host", "port")


ADMIN_TOKEN_MIN_LENGTH = 32
# A random token of 32 hex digits has ~14 distinct ones; fewer than this is a pattern.
_TOKEN_MIN_DISTINCT = 8
_WEEK = 7 * 24 * 3600


def _finite(**constraints: Any) -> Any:
    """A float Field with bounds that refuses inf and nan: an infinite grace or timeout
    is a wait that never ends."""
    return Field(allow_inf_nan=False, **constraints)


class SettingsError(Exception):
    """A setting has a value the app cannot use; the message names it and the fix."""


class Settings(BaseSettings):
    """The app's configuration. Each field's name is its environment variable."""

    model_config = SettingsConfigDict(env_file=".env", extra="ignore", frozen=True)

    DATABASE_URL: SecretUrl | None = Field(
        default=None,
        description="libpq URL of the app database; unset: `python -m app` runs an embedded one",
    )
    LOCK_DATABASE_URL: SecretUrl | None = Field(
        default=None,
        description="URL for the scheduler's lock connection (bypass a pooling proxy); "
        "defaults to DATABASE_URL",
    )
    ENVIRONMENT: Literal["development", "test", "production"] = "development"
    LOG_LEVEL: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    TIMEZONE: str = Field(default="UTC", description="IANA zone for cron jobs without tz=")
    REGENT_DATA_DIR: Path | None = Field(
        default=None,
        description="where the embedded PostgreSQL keeps its data, of one project (the "
        "first started on it claims it; another is refused); unset: one per user",
    )
    REGENT_APP: str = Field(
        default="app.main:app",
        description="module:attribute of the ASGI app `python -m app` serves",
    )
    REGENT_MIGRATIONS: str = Field(
        default="migrations",
        description="the alembic project of your own tables, relative to the project's "
        "root (the nearest directory, from the one the app starts in up, holding it or a "
        "pyproject.toml): `migrate` applies it after Regent's, start-up checks it is at "
        "head; set but not there: both refuse; empty: none",
    )
    REGENT_PG_PORT: int = Field(
        default=54320,
        ge=1,
        le=65535,
        description="port of the embedded PostgreSQL: names its socket in the data "
        "directory, and its TCP port when REGENT_PG_TCP is true",
    )
    REGENT_PG_TCP: bool = Field(
        default=False,
        description="the embedded PostgreSQL listens on 127.0.0.1:REGENT_PG_PORT too, for "
        "tools that cannot use its socket (Regent itself always uses the socket)",
    )
    OUTBOX_MAX_ATTEMPTS: int = Field(
        default=24, ge=1, le=1000, description="attempts after which an outbox row becomes stuck"
    )
    TRACKING_EVENT_RETENTION_DAYS: int = Field(default=365, ge=1, le=36500)
    RETENTION_ENABLED: bool = Field(
        default=True,
        description="whether every app prunes its history (the regent_retention job); "
        "off: nothing is ever deleted, as before retention (prune it yourself)",
    )
    RUN_HISTORY_DAYS: int = Field(
        default=30,
        ge=1,
        le=36500,
        description="days a job's run history is kept (the regent_retention job deletes "
        "older runs, but never one of the last RUN_HISTORY_KEEP of a job, nor a running one)",
    )
    RUN_HISTORY_KEEP: int = Field(
        default=100,
        ge=1,
        le=1_000_000,
        description="runs of each job kept whatever their age, so a rare job keeps its history",
    )
    OUTBOX_DELIVERED_DAYS: int = Field(
        default=7,
        ge=1,
        le=36500,
        description="days a delivered outbox row is kept (its key deduplicates enqueues "
        "that long); pending and stuck rows are never deleted",
    )
    BOOKING_REMINDERS_ENABLED: bool = Field(
        default=True, description="the booking_reminders job (it needs JobDeps(sms=...))"
    )
    SUBSCRIPTIONS_ENABLED: bool = Field(
        default=True,
        description="the subscription_charges job (it needs JobDeps(payments=...))",
    )
    UPDATES_CONSUMER_ENABLED: bool = Field(
        default=True, description="the updates_consumer service (it needs JobDeps(updates=...))"
    )
    REPORT_WARM_ENABLED: bool = True
    REPORT_WARM_INTERVAL_MINUTES: float = _finite(default=60, gt=0, le=_WEEK / 60)
    CREDIT_GRANTS_URL: SecretUrl | None = Field(
        default=None, description="receiver of credit grants; unset: grants wait, pending"
    )
    CHARGE_CLAIM_COOLDOWN_SECONDS: float = _finite(
        default=900, gt=0, le=_WEEK, description="a younger charge claim is a charge in flight"
    )
    ADMIN_TOKEN: SecretStr | None = Field(
        default=None,
        description="bearer token of the admin API and page, at least "
        f"{ADMIN_TOKEN_MIN_LENGTH} characters; unset: they 404",
    )
    API_TOKEN: SecretStr | None = Field(
        default=None,
        description="bearer token of the example routes /api/stats and /api/credits/grants, "
        f"at least {ADMIN_TOKEN_MIN_LENGTH} characters; unset: they 404",
    )
    API_DOCS_ENABLED: bool = Field(
        default=False,
        description="serve /docs and /redoc, whose scripts the browser loads from a CDN "
        "(cdn.jsdelivr.net) without an integrity check; false: they answer 404 "
        "(/openapi.json is served either way)",
    )
    TRUSTED_PROXIES: str = Field(
        default="",
        description="comma-separated addresses (or networks) of the proxies in front of "
        "the app, whose X-Forwarded-For and X-Forwarded-Proto `python -m app` believes; "
        "empty (the default): none, each request's client is its peer address",
    )
    DATABASE_CONNECT_TIMEOUT_SECONDS: float = _finite(default=10, gt=0, le=600)
    LEASE_SECONDS: int = Field(
        default=30,
        ge=2,
        le=3600,
        description="idle_session_timeout of the lock connection: the lease",
    )
    LEADER_TICK_SECONDS: float = _finite(default=5, gt=0, le=1800)
    HANDOVER_GRACE_SECONDS: float = _finite(default=1, ge=0, le=3600)
    SHUTDOWN_GRACE_SECONDS: float = _finite(default=10, ge=0, le=3600)
    CLAIM_AHEAD_SECONDS: float = _finite(default=0.5, ge=0, le=900)
    HOST_LOCK_ENABLED: bool = Field(
        default=True,
        description="only one worker per host (per REGENT_RUNTIME_DIR) queues for the "
        "leader key in PostgreSQL (the leader's host also keeps the leader's own); false: "
        "every worker holds a lock connection",
    )
    SCHEDULER_NAME: str = Field(
        default="default",
        description="the schedule this app's scheduler leads and fires (unless its "
        "Scheduler(name=...) says otherwise): apps of different names share one database, "
        "each with its own leader and jobs; 1-63 letters, digits, '_', '.', ':', '-'",
    )
    REGENT_RUNTIME_DIR: Path | None = Field(
        default=None,
        description="directory of the host's leader lock file, shared by the workers of "
        "one host (of this user, not writable by others, else a worker queues without it); "
        "unset: $XDG_RUNTIME_DIR/regent, /run/user/<uid>/regent, /run/regent as root, or "
        "<tmp>/regent-<uid>",
    )

    @field_validator("ADMIN_TOKEN", "API_TOKEN")
    @classmethod
    def _strong_token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        token = value.get_secret_value()
        if not token.strip() or token != token.strip():
            raise ValueError(
                "is empty or has surrounding whitespace; set a random value of at least "
                f"{ADMIN_TOKEN_MIN_LENGTH} characters (e.g. `openssl rand -hex 32`), or "
                "unset it to turn off the routes it guards"
            )
        if len(token) < ADMIN_TOKEN_MIN_LENGTH:
            raise ValueError(
                f"is {len(token)} characters; it must be at least {ADMIN_TOKEN_MIN_LENGTH}, "
                "a random value: make one with `openssl rand -hex 32`"
            )
        if len(set(token)) < _TOKEN_MIN_DISTINCT:
            # Its length guards against guessing only when it is random.
            raise ValueError(
                f"has only {len(set(token))} distinct characters: it is no random value; "
                "make one with `openssl rand -hex 32`"
            )
        return value

    @field_validator("TRUSTED_PROXIES")
    @classmethod
    def _proxy_addresses(cls, value: str) -> str:
        for item in filter(None, (part.strip() for part in value.split(","))):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(
                    f"{item!r} is not an IP address or network; list the addresses of the "
                    "proxies in front of the app, comma-separated (e.g. 10.0.0.5,10.0.1.0/24)"
                ) from None
        return value

    @field_validator("CREDIT_GRANTS_URL")
    @classmethod
    def _http_url(cls, value: SecretUrl | None) -> SecretUrl | None:
        if value is None or value.get_secret_value() == "":
            return None
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                "must be an http:// or https:// URL with a host, e.g. https://host/path"
            )
        return value

    @field_validator("DATABASE_URL", "LOCK_DATABASE_URL")
    @classmethod
    def _postgres_url(cls, value: SecretUrl | None) -> SecretUrl | None:
        if value is None or value.get_secret_value() == "":
            return None
        _parse_postgres_url(value.get_secret_value())
        return value

    @field_validator("REGENT_DATA_DIR")
    @classmethod
    def _usable_directory(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        for path in (value, *value.parents):
            if path.exists():
                if not path.is_dir():
                    raise ValueError(
                        f"{str(path)!r} exists and is not a directory; point it at a "
                        "directory (created if missing) where PostgreSQL may keep its data"
                    )
                break
        return value

    @field_validator("SCHEDULER_NAME")
    @classmethod
    def _schedule_name(cls, value: str) -> str:
        # The scheduler's own rule and message (app/scheduler/keys.py).
        return validate_schedule_name(value)

    @field_validator("TIMEZONE")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone_named(value)  # the triggers' own rule and message
        return value

    @model_validator(mode="after")
    def _tokens_apart(self) -> Settings:
        admin, api = self.ADMIN_TOKEN, self.API_TOKEN
        if (
            admin is not None
            and api is not None
            and admin.get_secret_value() == api.get_secret_value()
        ):
            raise ValueError(
                "ADMIN_TOKEN and API_TOKEN are the same token, so the API's holder could "
                "use the admin page and API too; give each its own (`openssl rand -hex 32`)"
            )
        return self

    @model_validator(mode="after")
    def _tick_inside_lease(self) -> Settings:
        if self.LEADER_TICK_SECONDS * 2 > self.LEASE_SECONDS:
            raise ValueError(
                "LEADER_TICK_SECONDS must be at most half of LEASE_SECONDS, or a healthy "
                f"leader loses its lease (tick {self.LEADER_TICK_SECONDS}, "
                f"lease {self.LEASE_SECONDS})"
            )
        if self.CLAIM_AHEAD_SECONDS * 4 > self.LEASE_SECONDS:
            raise ValueError(
                "CLAIM_AHEAD_SECONDS must be at most a quarter of LEASE_SECONDS: a claim "
                "holds its rows that long before its slot "
                f"(claim ahead {self.CLAIM_AHEAD_SECONDS}, lease {self.LEASE_SECONDS})"
            )
        return self

    @property
    def database_url(self) -> str | None:
        """DATABASE_URL with its password, for the code that connects (never print it)."""
        return _revealed(self.DATABASE_URL)

    @property
    def lock_database_url(self) -> str | None:
        """The URL the scheduler's lock connection uses, with its password."""
        return _revealed(self.LOCK_DATABASE_URL) or self.database_url

    @property
    def credit_grants_url(self) -> str | None:
        """CREDIT_GRANTS_URL with its credentials, for the transport that posts to it."""
        return _revealed(self.CREDIT_GRANTS_URL)

    @property
    def trusted_proxies(self) -> list[str]:
        """TRUSTED_PROXIES as a list; empty when no proxy is believed."""
        return [part.strip() for part in self.TRUSTED_PROXIES.split(",") if part.strip()]

    @property
    def is_production(self) -> bool:
        """True when ENVIRONMENT is production: the scheduler then fails closed."""
        return self.ENVIRONMENT == "production"


def _revealed(url: SecretUrl | str | None) -> str | None:
    # model_copy(update=...) skips validation, so a copied Settings may hold a plain str.
    return url.get_secret_value() if isinstance(url, SecretUrl) else url


def _parse_postgres_url(value: str) -> URL:
    try:
        url = make_url(value)
    except ArgumentError as exc:
        raise ValueError(
            "is not a database URL; expected postgresql://user:password@host:5432/dbname"
        ) from exc
    backend = url.drivername.split("+", 1)[0]
    if backend not in _POSTGRES_SCHEMES:
        raise ValueError(
            f"scheme {url.drivername!r} is not PostgreSQL; "
            "expected postgresql://user:password@host:5432/dbname"
        )
    if url.port is not None and not 1 <= url.port <= 65535:
        raise ValueError(f"port {url.port} is not between 1 and 65535")
    unknown = sorted(set(url.query) - set(_URL_PARAMETERS))
    if unknown:
        raise ValueError(
            f"query parameter(s) {', '.join(unknown)} are not supported; "
            f"use only {', '.join(_URL_PARAMETERS)}"
        )
    return url


def load_settings(**overrides: object) -> Settings:
    """Build Settings from the environment and the project's ``.env`` files, with
    ``overrides`` on top (``_env_file=None``: no file at all).

    The ``.env`` files are the project root's (app/project.py: found from the working
    directory up, as its migrations are), then the nearest one above the working
    directory, then the working directory's, each over the one before
    (``dot_env_files``): every command run anywhere inside a project reads the same
    settings. The environment goes over them all.

    Raises SettingsError naming each bad variable, its value and what it accepts.
    """
    if "_env_file" not in overrides:
        overrides["_env_file"] = dot_env_files()
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = ".".join(str(part) for part in error["loc"]) or "settings"
            value = error.get("input")
            # A URL may carry a password: never echo it.
            hidden = isinstance(value, dict) or name.endswith(("URL", "TOKEN"))
            shown = "" if hidden else f"={value!r}"
            message = error["msg"].removeprefix("Value error, ")
            problems.append(f"{name}{shown}: {message}")
        # One line: it is what a failed start prints, and the first thing read.
        raise SettingsError("invalid setting " + "; ".join(problems)) from None
