"""Regent: scheduled and background work for FastAPI backends.

The package is laid out as docs/DESIGN.md draws it: ``settings`` and ``db`` are the
foundation, ``localpg`` runs a throwaway or embedded PostgreSQL, ``scheduler`` is the
engine, and ``main`` wires them into a FastAPI app.
"""

from pathlib import Path

from ._import_name import refuse_a_shadowed_app

__all__: list[str] = []

# `uvicorn app.main:app` in a project whose own app/ has no __init__.py imports this
# package, not the project's: refused here, or Regent's demo would be served in its place.
refuse_a_shadowed_app(Path(__file__).resolve().parent)
