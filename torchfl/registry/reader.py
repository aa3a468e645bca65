"""Read-only queries as plain SQL over a DB-API connection, the same text on both backends.

Why not SQLAlchemy here: importing it costs ~0.5 s of CPU on the project's machines, and
``torchfl registry list`` must start in under half a second. Reads therefore use the
driver directly: the standard library's ``sqlite3``, or psycopg 3 for PostgreSQL (the
driver SQLAlchemy uses too). Writes and migrations always go through SQLAlchemy and
Alembic. The tables are defined once, in ``schema.py``; every registry test runs these
statements on both backends.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone

from torchfl.registry.engine import BUSY_TIMEOUT_S, CONNECT_TIMEOUT_S


class Reader:
    """A read transaction: ``rows(sql, params)`` with ``?`` placeholders."""

    def __init__(self, conn, dialect: str):
        self._conn = conn
        self.dialect = dialect

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        if self.dialect == "sqlite":
            return self._conn.execute(sql, params).fetchall()
        return [tuple(r) for r in self._conn.execute(sql.replace("?", "%s"), params).fetchall()]

    def first(self, sql: str, params: tuple = ()):
        rows = self.rows(sql, params)
        return rows[0] if rows else None

    def revision(self) -> str | None:
        """Alembic's stored revision; None when there is no version table (not a registry)."""
        if self.dialect == "sqlite":
            has = self.first("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'")
        else:
            has = self.first("SELECT 1 WHERE to_regclass('alembic_version') IS NOT NULL")
        if not has:
            return None
        row = self.first("SELECT version_num FROM alembic_version")
        return row[0] if row else ""


@contextlib.contextmanager
def sqlite_reader(path: str):
    """A deferred (snapshot) read transaction on an SQLite file, without SQLAlchemy."""
    import sqlite3

    import os
    from urllib.parse import quote

    folder = os.path.dirname(os.path.abspath(path))
    if not os.access(folder, os.W_OK) and not os.path.exists(path + "-shm"):
        # A read-only directory: SQLite cannot create the WAL index, but nobody can write
        # here either, so the file is read as immutable.
        conn = sqlite3.connect(f"file:{quote(os.path.abspath(path))}?immutable=1", uri=True,
                               timeout=BUSY_TIMEOUT_S, isolation_level=None)
    else:
        conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        conn.execute("BEGIN")
        yield Reader(conn, "sqlite")
        conn.execute("COMMIT")
    finally:
        conn.close()


def pg_connect_args(url: str) -> dict:
    """psycopg keyword arguments from a SQLAlchemy-style ``postgresql[+driver]://`` URL."""
    from urllib.parse import parse_qsl, unquote, urlsplit

    parts = urlsplit(url)
    args: dict = {}
    if parts.username:
        args["user"] = unquote(parts.username)
    if parts.password:
        args["password"] = unquote(parts.password)
    if parts.hostname:
        args["host"] = parts.hostname
    if parts.port:
        args["port"] = parts.port
    if parts.path.strip("/"):
        args["dbname"] = unquote(parts.path.lstrip("/"))
    args.update(parse_qsl(parts.query))
    args.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    return args


def pg_connect(url: str):
    """A read-only psycopg connection (each use is one transaction; see :func:`pg_reader`)."""
    import psycopg

    conn = psycopg.connect(**pg_connect_args(url))
    conn.read_only = True
    return conn


@contextlib.contextmanager
def pg_reader(conn):
    """One read-only transaction on ``conn``, without SQLAlchemy; always ended by a rollback."""
    try:
        yield Reader(conn, "postgresql")
    finally:
        if not conn.closed:
            conn.rollback()


def timestamp(value) -> datetime:
    """A stored time as an aware UTC datetime (SQLite hands back SQLAlchemy's text form)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)


def sqlite_errors():
    import sqlite3

    return (sqlite3.Error,)
