"""Regent: scheduled and background work for FastAPI backends.

The package is laid out as docs/DESIGN.md draws it: ``settings`` and ``db`` are the
foundation, ``localpg`` runs a throwaway or embedded PostgreSQL, ``scheduler`` is the
engine, and ``main`` wires them into a FastAPI app.
"""

__all__: list[str] = []
