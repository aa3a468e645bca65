"""PostgreSQL: a database on a server, through psycopg 3 (reads) and SQLAlchemy (writes).

Correctness under concurrency comes from the unique constraints and ``INSERT ... ON
CONFLICT DO NOTHING``; two migrations at once are serialised by a transaction-scoped
advisory lock. Reads keep one read-only connection per registry (a planner reads many
chips), each use one transaction ended by a rollback.
"""

from __future__ import annotations

import contextlib

from torchfl.registry.dialects import Dialect, Reader, ReadSession
from torchfl.registry.engine import CONNECT_TIMEOUT_S

MIGRATION_LOCK = 7315001  # pg_advisory_xact_lock key of schema migrations


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


class PostgresReader(Reader):
    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        return [tuple(r) for r in self._conn.execute(sql.replace("?", "%s"), params).fetchall()]

    def has_table(self, name: str) -> bool:
        return self.first("SELECT 1 WHERE to_regclass(?) IS NOT NULL", (name,)) is not None

    def tables(self) -> set[str]:
        return {r[0] for r in self.rows("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}


class PostgresReads(ReadSession):
    def __init__(self, url: str):
        self.url = url
        self._conn = None

    @contextlib.contextmanager
    def transaction(self):
        import psycopg

        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(**pg_connect_args(self.url))
            self._conn.read_only = True
        conn = self._conn
        try:
            yield PostgresReader(conn, "postgresql")
        except psycopg.Error:  # a broken connection: the next transaction opens a new one
            self.close()
            raise
        finally:
            if not conn.closed:
                conn.rollback()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresDialect(Dialect):
    name = "postgresql"

    def create_engine(self, u):
        from sqlalchemy import create_engine

        return create_engine(u, connect_args={"connect_timeout": CONNECT_TIMEOUT_S}, pool_pre_ping=False)

    def insert_ignore(self, table, keys=("name", "version")):
        from sqlalchemy.dialects.postgresql import insert

        return insert(table).on_conflict_do_nothing(index_elements=list(keys))

    def serialize_migrations(self, conn) -> None:
        from sqlalchemy import text

        conn.execute(text(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK})"))

    def read_session(self, url: str) -> ReadSession:
        return PostgresReads(url)

    def protect_rows_sql(self, table: str, message: str, events=("UPDATE", "DELETE")) -> list[str]:
        # torchfl_refuse_update() (revision 0001) raises "<table> rows are immutable: a published
        # version never changes"; row triggers do not see TRUNCATE, so a statement trigger
        # refuses it wherever DELETE is refused
        out = [f"CREATE TRIGGER trg_{table}_immutable BEFORE {' OR '.join(events)} ON {table} "
               "FOR EACH ROW EXECUTE FUNCTION torchfl_refuse_update()"]
        if "DELETE" in events:
            out.append(f"CREATE TRIGGER trg_{table}_truncate BEFORE TRUNCATE ON {table} "
                       "FOR EACH STATEMENT EXECUTE FUNCTION torchfl_refuse_update()")
        return out

    def unprotect_rows_sql(self, table: str) -> list[str]:
        return [self.drop_trigger_sql(table, f"trg_{table}_{name}") for name in ("immutable", "truncate")]

    def drop_trigger_sql(self, table: str, name: str) -> str:
        return f"DROP TRIGGER IF EXISTS {name} ON {table}"

    # torchfl_refuse_update() states one message for every table; evidence tables (revision
    # 0005 on) name what they hold through a trigger argument instead
    REFUSE_FUNCTION = "torchfl_refuse_change"

    def append_only_sql(self, table: str, message: str) -> list[str]:
        quoted = message.replace("'", "''")
        call = f"EXECUTE FUNCTION {self.REFUSE_FUNCTION}('{quoted}')"
        return [
            f"CREATE OR REPLACE FUNCTION {self.REFUSE_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
            "BEGIN\n    RAISE EXCEPTION '% rows are immutable: %', TG_TABLE_NAME, TG_ARGV[0];\nEND $$",
            *self.drop_append_only_sql(table),
            f"CREATE TRIGGER trg_{table}_immutable BEFORE UPDATE OR DELETE ON {table} FOR EACH ROW {call}",
            f"CREATE TRIGGER trg_{table}_truncate BEFORE TRUNCATE ON {table} FOR EACH STATEMENT {call}",
        ]

    def drop_append_only_sql(self, table: str) -> list[str]:
        return [self.drop_trigger_sql(table, f"trg_{table}_{name}") for name in ("immutable", "truncate")]

    def drop_refusal_function_sql(self) -> list[str]:
        return [f"DROP FUNCTION IF EXISTS {self.REFUSE_FUNCTION}()"]


POSTGRESQL = PostgresDialect()
