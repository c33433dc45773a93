"""A URL password may hold a raw "@" (httpx and SQLAlchemy take the userinfo up to the
last "@"), and no part of it may show where the URL is printed."""

from __future__ import annotations

import httpx

from app.redact import redact
from app.settings import Settings

PASSWORD = "hunter2@tail-of-secret"
TAIL = "tail-of-secret"


def test_a_url_password_with_an_at_sign_is_redacted_whole() -> None:
    url = f"http://user:{PASSWORD}@receiver.example/grants"
    assert httpx.URL(url).password == PASSWORD
    assert TAIL not in redact(f"POST {url}: ConnectError: refused")


def test_a_settings_repr_shows_no_part_of_a_password_with_an_at_sign() -> None:
    settings = Settings.model_validate(
        {
            "DATABASE_URL": f"postgresql+asyncpg://regent:{PASSWORD}@db.example:5432/regent",
            "CREDIT_GRANTS_URL": f"http://user:{PASSWORD}@receiver.example/grants",
        }
    )
    assert TAIL not in repr(settings)
