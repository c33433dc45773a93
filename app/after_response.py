"""Work after the response, with the contract the seed states, enforced.

``run_after_response(background, session, func, *values)``:
- refuses while ``session`` is still in a transaction: the row the request promised
  must be committed before the task is added;
- refuses anything but plain values (str, numbers, bool, None, datetimes, UUIDs and
  lists/dicts of them), never an ORM instance bound to the request's session;
- runs ``func`` after the response and logs its failure, never raises it.

A BackgroundTasks task is lost if the worker stops between response and task: anything
that must eventually happen goes through an outbox instead.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import uuid
from collections.abc import Callable
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from fastapi import BackgroundTasks
from sqlalchemy.ext.asyncio import AsyncSession

__all__ = ["AfterResponseError", "run_after_response"]

logger = logging.getLogger("app.after_response")

_PLAIN = (str, int, float, bool, type(None), Decimal, date, datetime, timedelta, uuid.UUID)


class AfterResponseError(Exception):
    """The task would break the after-response contract; the message says how."""


def _check_plain(value: Any, where: str) -> None:
    if isinstance(value, _PLAIN):
        return
    if isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_plain(item, f"{where}[{key!r}]")
        return
    raise AfterResponseError(
        f"{where} is a {type(value).__name__}; hand the task plain values (ids, strings, "
        "numbers), never an ORM object bound to the request's session"
    )


def run_after_response(
    background: BackgroundTasks,
    session: AsyncSession,
    func: Callable[..., Any],
    *args: Any,
    **kwargs: Any,
) -> None:
    """Schedule ``func(*args, **kwargs)`` after the response, under the contract above.

    Raises AfterResponseError when the session has an open transaction or a value is
    not plain.
    """
    if session.in_transaction():
        raise AfterResponseError(
            "the request's session is still in a transaction; commit the row the task "
            "relies on before adding the task"
        )
    for index, value in enumerate(args):
        _check_plain(value, f"argument {index}")
    for name, value in kwargs.items():
        _check_plain(value, f"argument {name!r}")
    background.add_task(_logged, func, args, kwargs)


async def _logged(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    try:
        if inspect.iscoroutinefunction(func):
            await func(*args, **kwargs)
        else:
            await asyncio.to_thread(func, *args, **kwargs)
    except Exception:
        logger.exception(
            "after-response task %s failed",
            getattr(func, "__qualname__", func),
            extra={"action": "after_response.failed"},
        )
