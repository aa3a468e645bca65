"""The registry's tables (SQLAlchemy Core). Alembic migrations create them; nothing else does.

Core rather than the ORM: the CLI must start fast and the queries are few and plain.
``tests/registry/test_migrations.py`` fails when these definitions and the migrations in
``migrations/versions/`` drift apart.

Immutability lives in the data model: ``(name, version)`` is unique, rows are only ever
inserted, and each row carries the SHA-256 of its canonical JSON.
"""

from __future__ import annotations

from sqlalchemy import (Boolean, Column, DateTime, Float, ForeignKey, Integer, MetaData, String, Table, Text,
                        UniqueConstraint)

from torchfl.registry.names import TABLE_NAMES

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

#: Published system descriptors (revision 0008): N chips of one HCD, the topology, host links
#: and link overrides (torchfl/hcd/system.py); same rules as chips. ``chip_version`` is NULL when
#: the system takes the registry's latest version of its chip.
system_versions = Table(
    TABLE_NAMES["system"], metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(64), nullable=False),
    Column("version", String(128), nullable=False),
    Column("chip_name", String(64), nullable=False, index=True),
    Column("chip_version", String(128), nullable=True),
    Column("chip_count", Integer, nullable=False),
    Column("source_name", String(1024), nullable=False),
    Column("source_text", Text, nullable=False),
    Column("canonical_json", Text, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("imported_at", DateTime(timezone=True), nullable=False),
    Column("import_id", Integer, ForeignKey("imports.id"), nullable=False),
    UniqueConstraint("name", "version"),
)

#: kind -> table; the store writes them in this order (a system's chip before the system)
TABLES = {"chip": chip_versions, "pack": pack_versions, "system": system_versions}


def _run_identity():
    """What an evidence run is tied to: the chip version by content, the rule packs
    (JSON list of [name, version, content_hash]) and the torchfl version."""
    return [
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("chip_name", String(64), nullable=False, index=True),
        Column("chip_version", String(128), nullable=False),
        Column("chip_hash", String(64), nullable=False),
        Column("packs", Text, nullable=False),
        Column("tool_version", String(32), nullable=False),
    ]


#: One ``torchfl conformance`` run (revision 0003); append-only, like every evidence table.
conformance_runs = Table(
    "conformance_runs", metadata,
    *_run_identity(),
    Column("harness_hash", String(64), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("settings", Text, nullable=False),
)

#: Its verdict per (overload, dtype, layout); ``first_failure`` is JSON.
conformance_results = Table(
    "conformance_results", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("conformance_runs.id"), nullable=False),
    Column("op", String(200), nullable=False, index=True),
    Column("dtype", String(16), nullable=False),
    Column("layout", String(32), nullable=False),
    Column("verdict", String(16), nullable=False),
    Column("samples", Integer, nullable=False),
    Column("passed", Integer, nullable=False),
    Column("failed", Integer, nullable=False),
    Column("refused", Integer, nullable=False),
    Column("max_abs_error", Float, nullable=True),
    Column("max_rel_error", Float, nullable=True),
    Column("reason", Text, nullable=True),
    Column("first_failure", Text, nullable=True),
    UniqueConstraint("run_id", "op", "dtype", "layout"),
)

#: One recorded model run's route accounting (``plan explain --analyze --record``).
route_runs = Table(
    "route_runs", metadata,
    *_run_identity(),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("model", String(200), nullable=False),
    Column("precision", String(16), nullable=True),
)

#: Nodes per (ATen op, route) in that run; route is a kernel name, ``fold`` or ``fallback``.
route_counts = Table(
    "route_counts", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("route_runs.id"), nullable=False),
    Column("op", String(200), nullable=False),
    Column("route", String(64), nullable=False),
    Column("count", Integer, nullable=False),
    UniqueConstraint("run_id", "op", "route"),
)

#: One ``torchfl fidelity --record`` run (revision 0006): a chip version's predictions scored
#: against published measurements; ``tables`` is JSON ``[[file name, sha256 of its text], ...]``.
fidelity_runs = Table(
    "fidelity_runs", metadata,
    *_run_identity(),
    Column("recorded_at", DateTime(timezone=True), nullable=False),
    Column("tables", Text, nullable=False),
)

#: Each scored row: what was measured, what the plan predicted (NULL: not planned, ``reason``
#: says why); ``in_sample``: a number of the chip was calibrated on this row's table.
fidelity_rows = Table(
    "fidelity_rows", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("fidelity_runs.id"), nullable=False),
    Column("table_name", String(200), nullable=False),
    Column("line", Integer, nullable=False),
    Column("op", String(200), nullable=False),
    Column("family", String(64), nullable=False),
    Column("shapes", Text, nullable=False),
    Column("dtype", String(16), nullable=False),
    Column("args", Text, nullable=False),
    Column("source", String(200), nullable=False),
    Column("measured_s", Float, nullable=False),
    Column("predicted_s", Float, nullable=True),
    Column("reason", Text, nullable=True),
    Column("in_sample", Boolean, nullable=False),
    UniqueConstraint("run_id", "table_name", "line"),
)

#: One sweep fanned out over workers (revision 0007): what it runs (``spec``, JSON), the keys
#: of its units (JSON list) and who started it. Append-only, like the evidence.
sweep_runs = Table(
    "sweep_runs", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("kind", String(32), nullable=False, index=True),
    Column("label", String(200), nullable=False),
    Column("spec", Text, nullable=False),
    Column("spec_hash", String(64), nullable=False),
    Column("units", Text, nullable=False),
    Column("unit_count", Integer, nullable=False),
    Column("tool_version", String(32), nullable=False),
    Column("driver", String(200), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

#: Each unit's result (JSON), written once by whichever worker ran it: (run, unit) is unique.
sweep_units = Table(
    "sweep_units", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("sweep_runs.id"), nullable=False),
    Column("unit", String(400), nullable=False),
    Column("result", Text, nullable=False),
    Column("node", String(200), nullable=False),
    Column("seconds", Float, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("run_id", "unit"),
)

#: A sweep's completion, once: what it produced from its units (JSON, e.g. the conformance run id).
sweep_finishes = Table(
    "sweep_finishes", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Integer, ForeignKey("sweep_runs.id"), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False),
    Column("outcome", Text, nullable=False),
    UniqueConstraint("run_id"),
)
