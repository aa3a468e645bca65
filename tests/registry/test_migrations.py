"""Alembic is the only author of the schema: up/down/up works and models never drift."""

from __future__ import annotations

import pytest
from tests.registry.registry_gen import hcd_text, pack_text

from torchfl.registry import Registry, SchemaMismatch, migrate
from torchfl.registry.engine import WRITE, create_registry_engine
from torchfl.registry.names import HEAD, REVISIONS
from torchfl.registry.schema import metadata

TABLES = {"alembic_version", "imports", "chip_versions", "pack_versions", "conformance_runs", "conformance_results",
          "route_runs", "route_counts", "fidelity_runs", "fidelity_rows", "sweep_runs", "sweep_units",
          "sweep_finishes", "system_versions"}
FIDELITY = {"fidelity_runs", "fidelity_rows"}     # revision 0006
SWEEPS = {"sweep_runs", "sweep_units", "sweep_finishes"}     # revision 0007
SYSTEMS = {"system_versions"}     # revision 0008
EVIDENCE = {"conformance_runs", "conformance_results", "route_runs", "route_counts"} | FIDELITY | SWEEPS


def _tables(engine) -> set[str]:
    from sqlalchemy import inspect

    return set(inspect(engine).get_table_names())


@pytest.fixture
def engine(registry_url):
    eng = create_registry_engine(registry_url)
    yield eng
    eng.dispose()


def _migrate(engine, fn, target):
    with engine.connect() as conn:
        conn = conn.execution_options(**WRITE)
        with conn.begin():
            fn(conn, target)


def test_upgrade_downgrade_upgrade(registry_url, engine):
    _migrate(engine, migrate.upgrade, "head")
    assert _tables(engine) == TABLES
    with Registry(registry_url) as r:
        r.import_texts([("a.hcd", hcd_text("A-1"))])
        assert r.schema_revision() == HEAD
    _migrate(engine, migrate.downgrade, "0007")
    assert _tables(engine) == TABLES - SYSTEMS
    _migrate(engine, migrate.downgrade, "0006")
    assert _tables(engine) == TABLES - SWEEPS - SYSTEMS
    _migrate(engine, migrate.downgrade, "0005")
    assert _tables(engine) == TABLES - FIDELITY - SWEEPS - SYSTEMS
    _migrate(engine, migrate.downgrade, "0002")
    assert _tables(engine) == TABLES - EVIDENCE - SYSTEMS
    _migrate(engine, migrate.downgrade, "0001")
    assert _tables(engine) == TABLES - EVIDENCE - SYSTEMS - {"pack_versions"}
    _migrate(engine, migrate.downgrade, "base")
    assert _tables(engine) <= {"alembic_version"}
    _migrate(engine, migrate.upgrade, "head")
    assert _tables(engine) == TABLES
    with Registry(registry_url) as r:
        assert r.chips() == []
        r.import_texts([("a.hcd", hcd_text("A-1"))])
        assert [c.name for c in r.chips()] == ["A-1"]


def test_models_and_migrations_do_not_drift(registry_url, engine):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    _migrate(engine, migrate.upgrade, "head")
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        diffs = compare_metadata(ctx, metadata)
    assert diffs == [], f"schema.py and migrations/versions disagree; write a migration: {diffs}"


def test_code_knows_the_scripts_head(registry_url):
    assert migrate.script_head() == HEAD and REVISIONS[-1] == HEAD
    with Registry(registry_url) as r:
        assert r.init()["to"] == HEAD


def _publish(registry_url, tmp_path) -> tuple[str, str]:
    with Registry(registry_url) as r:
        r.init()
        r.import_texts([("a.hcd", hcd_text("A-1"))])
        pack = tmp_path / "mini.yaml"
        pack.write_text(pack_text())
        r.import_files([pack])
        return r.record("A-1").content_hash, r.packs()[0].name


@pytest.mark.parametrize("table", ["chip_versions", "pack_versions"])
@pytest.mark.parametrize("statement", ["UPDATE {t} SET content_hash = 'forged'", "DELETE FROM {t}", "TRUNCATE {t}"])
def test_published_rows_cannot_be_changed_even_by_sql(registry_url, table, statement, tmp_path):
    # issue #20: a raw SQL DELETE of a published version was allowed (only UPDATE was blocked)
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    if statement.startswith("TRUNCATE") and registry_url.startswith("sqlite"):
        pytest.skip("SQLite has no TRUNCATE (its DELETE without WHERE is covered)")
    before, pack = _publish(registry_url, tmp_path)
    engine = create_registry_engine(registry_url)
    with pytest.raises(DBAPIError, match="immutable"):
        with engine.begin() as conn:
            conn.execute(text(statement.format(t=table)))
    engine.dispose()
    with Registry(registry_url) as r:
        assert r.record("A-1").content_hash == before and [p.name for p in r.packs()] == [pack]


@pytest.mark.parametrize("start", ["base", *REVISIONS[:-1]])
def test_upgrade_brings_any_known_revision_to_head(registry_url, engine, start, cli):
    # issue #20: after `alembic downgrade base`, upgrade and init refused ("revision ''") and
    # list said "no such table"
    _migrate(engine, migrate.upgrade, "head")
    _migrate(engine, migrate.downgrade, start)
    if start == "base":
        with Registry(registry_url) as r:
            with pytest.raises(SchemaMismatch, match="registry upgrade"):
                r.chips()
        listing = cli("list")
        assert listing.exit_code == 2 and "torchfl registry upgrade" in listing.output
    result = cli("upgrade")
    assert result.exit_code == 0, result.output
    with Registry(registry_url) as r:
        assert r.schema_revision() == HEAD and r.chips() == []
        r.import_texts([("a.hcd", hcd_text("A-1"))])
        assert r.init()["from"] == HEAD


def test_init_and_upgrade_work_on_an_emptied_database(registry_url, engine):
    _migrate(engine, migrate.upgrade, "head")
    _migrate(engine, migrate.downgrade, "base")
    with Registry(registry_url) as r:
        assert r.init(seed=True)["from"] == ""
        assert r.schema_revision() == HEAD and r.chips()


def test_upgrade_creates_the_schema_in_an_empty_database(registry_url, engine):
    with engine.begin() as conn:  # SQLite: an existing, empty file; PostgreSQL: a fresh database
        from sqlalchemy import text

        conn.execute(text("SELECT 1"))
    with Registry(registry_url) as r:
        assert r.upgrade() is None and r.schema_revision() == HEAD
