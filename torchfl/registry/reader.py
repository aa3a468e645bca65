"""Read-only queries as plain SQL over a DB-API connection, the same text on both backends.

Why not SQLAlchemy here: importing it costs ~0.5 s of CPU on the project's machines, and
``torchfl registry list`` must start in under half a second. Reads therefore use the
driver directly: the standard library's ``sqlite3``, or psycopg 3 for PostgreSQL (the
driver SQLAlchemy uses too); each dialect's read transaction and catalogue queries are in
``dialects/``. Writes and migrations always go through SQLAlchemy and Alembic. The tables
are defined once, in ``schema.py``; every registry test runs these statements on both
backends.
"""

from __future__ import annotations

from datetime import datetime, timezone


def timestamp(value) -> datetime:
    """A stored time as an aware UTC datetime (SQLite hands back SQLAlchemy's text form)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
