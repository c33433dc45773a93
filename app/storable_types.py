"""Storable values as types that routes and models declare (app/storable.py): a value
past a column's limits is a 422 naming the field, before any query runs."""

from __future__ import annotations

from typing import Annotated

from annotated_types import Interval
from pydantic import AfterValidator

from app.storable import INT32_MAX, JSON_INT_MAX, storable_text

__all__ = ["Int32Id", "PositiveJsonInt", "StorableText"]

StorableText = Annotated[str, AfterValidator(storable_text)]
"""A string a text column accepts."""

Int32Id = Annotated[int, Interval(ge=1, le=INT32_MAX)]
"""The id of a row keyed by an ``integer`` identity column."""

PositiveJsonInt = Annotated[int, Interval(gt=0, le=JSON_INT_MAX)]
"""A positive amount in a JSON body (so in a ``bigint`` column too) that every client
sends and reads back exactly."""
