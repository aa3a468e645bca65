"""Issue 39: on PostgreSQL, ``TRUNCATE`` of an evidence table (or ``... CASCADE`` from the runs)
wiped every run silently (row triggers do not see TRUNCATE), and an edit's refusal said "a
published version never changes", the chips' message. Revision 0005: every evidence table
refuses UPDATE, DELETE and TRUNCATE, saying what it holds; on SQLite and a real server."""

from __future__ import annotations

import pytest

from tests.registry.test_evidence import _record, _row, chip_reg  # noqa: F401 - the fixture

TABLES = ["conformance_runs", "conformance_results", "route_runs", "route_counts"]


def _fill(reg):
    _record(reg, "A-1", [_row(), _row(op="aten.mul.Tensor")])
    reg.record_routes(reg.identity("A-1"), model="m", precision=None, routes={"aten::add": {"add": 1}})


def _refused(url: str, statement: str) -> str:
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from torchfl.registry.engine import create_registry_engine

    engine = create_registry_engine(url)
    try:
        with pytest.raises(DBAPIError) as info:
            with engine.begin() as conn:
                conn.execute(text(statement))
    finally:
        engine.dispose()
    return str(info.value.orig)


@pytest.mark.parametrize("statement", ["TRUNCATE {t}", "TRUNCATE {t} CASCADE", "TRUNCATE {t} RESTART IDENTITY CASCADE"])
@pytest.mark.parametrize("table", TABLES)
def test_evidence_tables_refuse_truncate(chip_reg, registry_url, table, statement):  # noqa: F811
    if registry_url.startswith("sqlite"):
        pytest.skip("SQLite has no TRUNCATE (its DELETE without WHERE is refused: test_evidence)")
    _fill(chip_reg)
    message = _refused(registry_url, statement.format(t=table))
    if table in ("conformance_runs", "route_runs") and "CASCADE" not in statement:
        assert "foreign key" in message or "evidence is never edited" in message, message  # refused either way
    else:
        assert "rows are immutable: evidence is never edited" in message, message
    assert len(chip_reg.evidence()) == 2 and len(chip_reg.routes("A-1")) == 1   # all kept


@pytest.mark.parametrize("statement", ["UPDATE {t} SET id = id", "DELETE FROM {t}"])
@pytest.mark.parametrize("table", TABLES)
def test_evidence_refusals_say_what_the_table_holds(chip_reg, registry_url, table, statement):  # noqa: F811
    _fill(chip_reg)
    message = _refused(registry_url, statement.format(t=table))
    assert f"{table} rows are immutable: evidence is never edited; a newer run supersedes it" in message, message
    assert "published version" not in message


def test_chip_tables_keep_their_own_message(chip_reg, registry_url):  # noqa: F811
    message = _refused(registry_url, "DELETE FROM chip_versions")
    assert "a published version never changes" in message


def test_downgrade_to_0004_and_back_keeps_evidence_protected(chip_reg, registry_url):  # noqa: F811
    from torchfl.registry import migrate
    from torchfl.registry.engine import WRITE, create_registry_engine

    _fill(chip_reg)
    chip_reg.close()
    engine = create_registry_engine(registry_url)
    for fn, target in ((migrate.downgrade, "0004"), (migrate.upgrade, "head")):
        with engine.connect() as conn:
            conn = conn.execution_options(**WRITE)
            with conn.begin():
                fn(conn, target)
        if target == "0004":   # revision 0003's triggers again: edits refused, TRUNCATE not yet
            assert "immutable" in _refused(registry_url, "DELETE FROM conformance_results")
    engine.dispose()
    assert "evidence is never edited" in _refused(registry_url, "DELETE FROM conformance_results")
    assert len(chip_reg.evidence()) == 2
