"""The registry's tables (SQLAlchemy Core). Alembic migrations create them; nothing else does.

Core rather than the ORM: the CLI must start fast and the queries are few and plain.
``tests/registry/test_migrations.py`` fails when these definitions and the migrations in
``migrations/versions/`` drift apart.

Immutability lives in the data model: ``(name, version)`` is unique, rows are only ever
inserted, and each row carries the SHA-256 of its canonical JSON.
"""

from __future__ import annotations

from sqlalchemy import (Column, DateTime, ForeignKey, Integer, MetaData, String, Table, Text,
                        UniqueConstraint)

from torchfl.registry.names import HEAD, REVISIONS, TABLE_NAMES  # noqa: F401  (re-exported)

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING)

#: One row per import command that added something (one transaction).
imports = Table(
    "imports", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("imported_at", DateTime(timezone=True), nullable=False),
    Column("tool_version", String(32), nullable=False),
    Column("files", Integer, nullable=False),
)

#: Published chip descriptors (revision 0001).
chip_versions = Table(
    TABLE_NAMES["chip"], metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False),
    Column("version", String(128), nullable=False),
    Column("vendor", String(200), nullable=False),
    Column("device_type", String(32), nullable=False, index=True),
    Column("source_name", String(1024), nullable=False),
    Column("source_text", Text, nullable=False),
    Column("canonical_json", Text, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("imported_at", DateTime(timezone=True), nullable=False),
    Column("import_id", Integer, ForeignKey("imports.id"), nullable=False),
    UniqueConstraint("name", "version"),
)

#: Published rule packs (revision 0002), same rules as chips.
pack_versions = Table(
    TABLE_NAMES["pack"], metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(128), nullable=False),
    Column("version", String(128), nullable=False),
    Column("source_name", String(1024), nullable=False),
    Column("source_text", Text, nullable=False),
    Column("canonical_json", Text, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("imported_at", DateTime(timezone=True), nullable=False),
    Column("import_id", Integer, ForeignKey("imports.id"), nullable=False),
    UniqueConstraint("name", "version"),
)

TABLES = {"chip": chip_versions, "pack": pack_versions}
