"""What differs between the registry's two backends, one module per dialect.

The rest of the registry is written once against :class:`Dialect`; nothing outside this
package asks which backend it runs on. A dialect covers:

- the location: an SQLite file (may be missing, read-only, needs its folder) or a
  PostgreSQL database on a server (none of these apply);
- writes and migrations through SQLAlchemy: the engine's set-up, the race-free
  ``INSERT ... ON CONFLICT (name, version) DO NOTHING``, and serialising two migrations;
- reads straight on the driver (no SQLAlchemy import, for the CLI's start-up): the
  read transaction, the placeholder style and the catalogue query;
- the triggers that make published rows immutable against raw SQL ``UPDATE``/``DELETE``
  (and ``TRUNCATE``), and evidence tables append-only (used by the migrations).

Importing this package imports neither SQLAlchemy nor a driver.
"""

from __future__ import annotations

import contextlib


class Dialect:
    """The interface; see :mod:`.sqlite` and :mod:`.postgresql`."""

    name = ""

    # -- location
    def missing(self, url: str) -> bool:
        """True when the registry's storage does not exist yet (and could be created)."""
        return False

    def create_location(self, url: str) -> None:
        """Make what :meth:`missing` lacked creatable (an SQLite file's folder)."""

    def check_writable(self, url: str) -> None:
        """Raise RegistryUnavailable before a write that this process cannot make."""

    # -- SQLAlchemy side
    def create_engine(self, u):
        raise NotImplementedError

    def insert_ignore(self, table, keys=("name", "version")):
        """``INSERT ... ON CONFLICT (<keys>) DO NOTHING`` for ``table`` (``keys``: a unique constraint's columns)."""
        raise NotImplementedError

    def serialize_migrations(self, conn) -> None:
        """Make a second concurrent migration wait for the first (inside its transaction)."""

    # -- driver side (reads)
    def read_session(self, url: str) -> "ReadSession":
        raise NotImplementedError

    # -- immutability in the database itself (DDL for the migrations)
    def protect_rows_sql(self, table: str, message: str, events=("UPDATE", "DELETE")) -> list[str]:
        """Statements that make the database refuse ``events`` on ``table``'s rows (raising
        "<table> rows are immutable: <message>")."""
        raise NotImplementedError

    def unprotect_rows_sql(self, table: str) -> list[str]:
        """Statements that drop what :meth:`protect_rows_sql` created."""
        raise NotImplementedError

    def drop_trigger_sql(self, table: str, name: str) -> str:
        raise NotImplementedError

    def append_only_sql(self, table: str, message: str) -> list[str]:
        """Statements that make ``table`` append-only in the database itself: UPDATE, DELETE
        and TRUNCATE refused with "<table> rows are immutable: <message>" (the message says
        what the table holds). Idempotent: drops what it replaces."""
        raise NotImplementedError

    def drop_append_only_sql(self, table: str) -> list[str]:
        """Statements that drop what :meth:`append_only_sql` created on ``table``."""
        raise NotImplementedError

    def drop_refusal_function_sql(self) -> list[str]:
        """Statements that drop the refusal function :meth:`append_only_sql` creates, if any."""
        raise NotImplementedError


class Reader:
    """A read transaction: ``rows(sql, params)`` with ``?`` placeholders, the same SQL on both."""

    def __init__(self, conn, dialect: str):
        self._conn = conn
        self.dialect = dialect

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return self._conn.execute(sql, params).fetchall()

    def first(self, sql: str, params: tuple = ()):
        rows = self.rows(sql, params)
        return rows[0] if rows else None

    def has_table(self, name: str) -> bool:
        raise NotImplementedError

    def tables(self) -> set[str]:
        raise NotImplementedError

    def revision(self) -> str | None:
        """Alembic's stored revision: None when there is no version table, "" when it is empty
        (after ``alembic downgrade base``)."""
        if not self.has_table("alembic_version"):
            return None
        row = self.first("SELECT version_num FROM alembic_version")
        return row[0] if row else ""

    def integrity_check(self, tables) -> str:
        """``"ok"``, or what the backend found wrong."""
        for table in tables:
            self.rows(f"SELECT count(*) FROM {table}")
        return "ok"


class ReadSession:
    """Read transactions on one registry; ``close()`` releases what it keeps open."""

    @contextlib.contextmanager
    def transaction(self):
        raise NotImplementedError
        yield  # pragma: no cover

    def close(self) -> None:
        pass


def dialect_for(backend: str) -> Dialect:
    """The dialect of a backend name as :func:`torchfl.registry.engine.check_url` gives it."""
    if backend == "sqlite":
        from torchfl.registry.dialects.sqlite import SQLITE

        return SQLITE
    if backend == "postgresql":
        from torchfl.registry.dialects.postgresql import POSTGRESQL

        return POSTGRESQL
    raise ValueError(f"no registry dialect {backend!r}")  # check_url refused it before
