"""Statements on a plain asyncpg connection (a drain's, the wake-up's), written as
SQLAlchemy text: a pass skips SQLAlchemy's per-statement overhead on its hot path, and
its statements still read as the rest of the outbox's SQL (sql.py)."""

from __future__ import annotations

import functools
import json
from typing import Any

from sqlalchemy import TextClause
from sqlalchemy.dialects import postgresql

__all__ = ["fetch", "prepare_connection"]

_DIALECT = postgresql.asyncpg.dialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]


@functools.cache
def _asyncpg_form(statement: TextClause) -> tuple[str, tuple[str, ...]]:
    """The statement as asyncpg SQL ($1, $2, ...) and its parameter names in order."""
    compiled = statement.compile(dialect=_DIALECT)
    return str(compiled), tuple(compiled.positiontup or ())


async def fetch(connection: Any, statement: TextClause, params: dict[str, Any]) -> list[Any]:
    """Run ``statement`` (SQLAlchemy text, ``:name`` parameters) on a plain asyncpg
    ``connection`` and return its rows."""
    query, names = _asyncpg_form(statement)
    return list(await connection.fetch(query, *(params[name] for name in names)))


async def prepare_connection(connection: Any) -> None:
    """Make a plain asyncpg connection (not the engine's) fit for drain passes: decode
    jsonb payloads as the engine's connections do (SQLAlchemy's asyncpg dialect
    registers the codec on those)."""
    await connection.set_type_codec(
        "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
    )
