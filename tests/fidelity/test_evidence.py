"""Fidelity evidence (revision 0006): runs and rows append-only, the latest run per chip,
stale once the chip moves on, and plan explain's "checked" line; on SQLite and a real
PostgreSQL server (the ``registry_url`` fixture runs both)."""

from __future__ import annotations

import pytest
from tests.registry.registry_gen import hcd_text, one_chip_registry

from torchfl.registry import Registry
from torchfl.registry.fidelity import checked_line, check_row, fidelity_runs, fidelity_summary, record_fidelity


@pytest.fixture
def reg(registry_url, tmp_path):
    r = one_chip_registry(registry_url, tmp_path)
    yield r
    r.close()


def _row(line, measured, predicted, *, table="t.csv", in_sample=False, reason=None):
    return dict(table_name=table, line=line, op="aten.mm.default", family="matmul", shapes=[[8, 8], [8, 8]],
                dtype="float16", args={}, source="s", measured_s=measured, predicted_s=predicted, reason=reason,
                in_sample=in_sample)


def test_a_recorded_run_reads_back_with_its_errors(reg):
    ident = reg.identity("A-1")
    run = record_fidelity(reg, ident, tables=[["t.csv", "ab" * 32]], rows=[
        _row(3, 1e-3, 1.1e-3), _row(4, 2e-3, 1.5e-3), _row(5, 1e-3, None, reason="refused"),
        _row(2, 1e-3, 1e-3, table="cal.csv", in_sample=True)])
    (summary,) = fidelity_runs(reg, chip="A-1")
    assert summary["run"] == run and summary["chip_hash"] == ident.chip_hash
    assert (summary["rows"], summary["planned"], summary["out_of_sample"]) == (4, 3, 2)
    assert summary["mean_abs_error"] == pytest.approx((0.1 + 0.25 + 0.0) / 3)
    assert summary["out_of_sample_mean_abs_error"] == pytest.approx((0.1 + 0.25) / 2)
    assert summary["tables"] == [["t.csv", "ab" * 32]]
    line = checked_line(fidelity_summary(reg, "A-1"))
    assert line.startswith("A-1: predictions checked on 2 published measurements, mean error 18% "
                           "out of sample (1 in-sample row not counted)")      # the out-of-sample figure
    assert f"(run {run}, " in line


def test_the_latest_run_speaks_and_a_new_chip_version_makes_it_stale(reg):
    assert checked_line(fidelity_summary(reg, "A-1")).startswith("A-1: predictions unchecked")
    record_fidelity(reg, reg.identity("A-1"), tables=[], rows=[_row(3, 1e-3, 2e-3)])
    newer = record_fidelity(reg, reg.identity("A-1"), tables=[], rows=[_row(3, 1e-3, 1.05e-3)])
    s = fidelity_summary(reg, "A-1")
    assert s["state"] == "checked" and s["run"] == newer and s["mean_abs_error"] == pytest.approx(0.05)
    reg.import_texts([("a2.hcd", hcd_text("A-1", "1.1.0", peak=25.6))])
    s = fidelity_summary(reg, "A-1")
    assert s["state"] == "stale" and "now 1.1.0" in checked_line(s)


def test_a_bad_row_refuses_the_run_and_writes_nothing(reg):
    with pytest.raises(ValueError, match="t.csv:3: measured_s must be a positive time"):
        record_fidelity(reg, reg.identity("A-1"), tables=[], rows=[_row(4, 1e-3, 1e-3), _row(3, 0.0, 1e-3)])
    with pytest.raises(ValueError, match="lacks family"):
        check_row({k: v for k, v in _row(3, 1e-3, 1e-3).items() if k != "family"})
    assert fidelity_runs(reg) == []


def test_duplicate_rows_roll_the_run_back(reg):
    from torchfl.registry import RegistryError

    with pytest.raises(RegistryError):
        record_fidelity(reg, reg.identity("A-1"), tables=[], rows=[_row(3, 1e-3, 1e-3), _row(3, 1e-3, 1e-3)])
    assert fidelity_runs(reg) == []


@pytest.mark.parametrize("table", ["fidelity_runs", "fidelity_rows"])
@pytest.mark.parametrize("statement", ["UPDATE {t} SET id = id", "DELETE FROM {t}"])
def test_fidelity_rows_cannot_be_edited_even_by_sql(reg, registry_url, table, statement):
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from torchfl.registry.engine import create_registry_engine

    record_fidelity(reg, reg.identity("A-1"), tables=[], rows=[_row(3, 1e-3, 1e-3)])
    engine = create_registry_engine(registry_url)
    with pytest.raises(DBAPIError, match="immutable"):
        with engine.begin() as conn:
            conn.execute(text(statement.format(t=table)))
    engine.dispose()
    assert fidelity_runs(reg)[0]["rows"] == 1


@pytest.mark.postgres
def test_truncate_is_refused_on_postgresql(pg_url, tmp_path):
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    from torchfl.registry.engine import create_registry_engine

    r = Registry(pg_url)
    r.init()
    r.import_texts([("a.hcd", hcd_text("A-1"))])
    record_fidelity(r, r.identity("A-1"), tables=[], rows=[_row(3, 1e-3, 1e-3)])
    engine = create_registry_engine(pg_url)
    with pytest.raises(DBAPIError, match="immutable"):
        with engine.begin() as conn:
            conn.execute(text("TRUNCATE fidelity_rows, fidelity_runs"))
    engine.dispose()
    assert fidelity_runs(r)[0]["rows"] == 1
    r.close()
