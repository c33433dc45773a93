"""A URL setting that may carry a password: shown redacted, handed out whole.

``repr()``, ``str()`` and formatting show the URL through :func:`app.redact.redact`
(scheme, host, port and path kept for diagnosis; userinfo and secret-named query
values replaced by ``***``), so printing the settings, a traceback's locals or an
error message that quotes the object never shows the password. The code that connects
calls ``get_secret_value()``.
"""

from __future__ import annotations

from pydantic import SecretStr

from .redact import redact

__all__ = ["SecretUrl"]


class SecretUrl(SecretStr):
    """A URL whose credentials never appear when it is printed."""

    def _display(self) -> str:
        return redact(self.get_secret_value())

    def __format__(self, spec: str) -> str:
        return format(self._display(), spec)
