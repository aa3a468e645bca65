"""SQLite: a file. WAL journal (readers never block the writer), a busy timeout, and write
transactions opened with ``BEGIN IMMEDIATE`` so that concurrent writers queue on the lock
instead of failing when a read lock cannot be upgraded (which also serialises migrations)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from torchfl.registry.dialects import Dialect, Reader, ReadSession
from torchfl.registry.engine import BUSY_TIMEOUT_S
from torchfl.registry.errors import RegistryUnavailable
from torchfl.registry.url import display_url


def sqlite_file(url: str) -> str | None:
    """The database file of an SQLite URL (``sqlite:///rel`` or ``sqlite:////abs``); None in memory."""
    rest = url.split("://", 1)[1] if "://" in url else ""
    path = rest[1:] if rest.startswith("/") else rest
    path = path.split("?", 1)[0]
    return None if path in ("", ":memory:") else path


class SQLiteReader(Reader):
    def has_table(self, name: str) -> bool:
        return self.first("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)) is not None

    def tables(self) -> set[str]:
        return {r[0] for r in self.rows("SELECT name FROM sqlite_master WHERE type = 'table'")}

    def integrity_check(self, tables) -> str:
        return self.first("PRAGMA integrity_check")[0]


class SQLiteReads(ReadSession):
    """A fresh connection per read transaction (a deferred, snapshot transaction)."""

    def __init__(self, url: str):
        self.path = sqlite_file(url)
        self.url = url

    @contextlib.contextmanager
    def transaction(self):
        import sqlite3
        from urllib.parse import quote

        if not os.path.exists(self.path):
            raise RegistryUnavailable(
                f"no registry at {display_url(self.url)} (the file does not exist); create it with "
                f"`torchfl registry init --registry {display_url(self.url)}`, or check the path")
        folder = os.path.dirname(os.path.abspath(self.path))
        if not os.access(folder, os.W_OK) and not os.path.exists(self.path + "-shm"):
            # A read-only directory: SQLite cannot create the WAL index, but nobody can write
            # here either, so the file is read as immutable.
            conn = sqlite3.connect(f"file:{quote(os.path.abspath(self.path))}?immutable=1", uri=True,
                                   timeout=BUSY_TIMEOUT_S, isolation_level=None)
        else:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            conn.execute("BEGIN")
            yield SQLiteReader(conn, "sqlite")
            conn.execute("COMMIT")
        finally:
            conn.close()


class SQLiteDialect(Dialect):
    name = "sqlite"

    def missing(self, url: str) -> bool:
        path = sqlite_file(url)
        return path is not None and not os.path.exists(path)

    def create_location(self, url: str) -> None:
        Path(sqlite_file(url)).parent.mkdir(parents=True, exist_ok=True)

    def check_writable(self, url: str) -> None:
        path = sqlite_file(url)
        if path is None or not os.path.exists(path):
            return
        folder = os.path.dirname(os.path.abspath(path))
        for what, p in (("file", path), ("directory", folder)):
            if not os.access(p, os.W_OK):
                raise RegistryUnavailable(
                    f"registry {display_url(url)} is read-only (no write permission on its {what} {p}; SQLite "
                    "also writes -wal/-shm files beside it); make both writable, or import into another registry "
                    "with --registry URL")

    def create_engine(self, u):
        import sqlite3

        from sqlalchemy import create_engine, event

        engine = create_engine(u, connect_args={"timeout": BUSY_TIMEOUT_S})

        @event.listens_for(engine, "connect")
        def _connect(dbapi_conn, _record):
            # Let SQLAlchemy (not pysqlite) issue BEGIN, so we choose its kind below.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            cur.execute("PRAGMA foreign_keys = ON")
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                try:
                    cur.execute("PRAGMA journal_mode = WAL")
                except sqlite3.OperationalError:  # read-only file: stay in its mode; writes report it
                    pass
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn):
            kind = "IMMEDIATE" if conn.get_execution_options().get("torchfl_write") else "DEFERRED"
            conn.exec_driver_sql(f"BEGIN {kind}")

        return engine

    def insert_ignore(self, table, keys=("name", "version")):
        from sqlalchemy.dialects.sqlite import insert

        return insert(table).on_conflict_do_nothing(index_elements=list(keys))

    def read_session(self, url: str) -> ReadSession:
        return SQLiteReads(url)

    def protect_rows_sql(self, table: str, message: str, events=("UPDATE", "DELETE")) -> list[str]:
        return [f"CREATE TRIGGER trg_{table}_{event.lower()} BEFORE {event} ON {table} BEGIN "
                f"SELECT RAISE(ABORT, '{table} rows are immutable: {message}'); END" for event in events]

    def unprotect_rows_sql(self, table: str) -> list[str]:
        return [self.drop_trigger_sql(table, f"trg_{table}_{event}") for event in ("update", "delete")]

    def drop_trigger_sql(self, table: str, name: str) -> str:
        return f"DROP TRIGGER IF EXISTS {name}"

    def append_only_sql(self, table: str, message: str) -> list[str]:
        # SQLite has no TRUNCATE: its DELETE without WHERE fires the DELETE trigger (the
        # truncate optimisation is off for a table with DELETE triggers)
        return self.drop_append_only_sql(table) + self.protect_rows_sql(table, message.replace("'", "''"))

    def drop_append_only_sql(self, table: str) -> list[str]:
        return self.unprotect_rows_sql(table)

    def drop_refusal_function_sql(self) -> list[str]:
        return []


SQLITE = SQLiteDialect()
