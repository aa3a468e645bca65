"""Every bundled HCD number of kind ``microbenchmark`` that names a ``table`` equals what
``fidelity.calibrate`` derives from that table (issue 47: the number is reproducible from the
published measurement, not set by hand), and no bundled number is ``fitted``."""

from __future__ import annotations

import pytest

from torchfl.fidelity.calibrate import calibrate
from torchfl.fidelity.tables import load_table
from torchfl.hcd import load_hcd
from torchfl.resources import bundled_path

CHIPS = sorted(bundled_path("hcd_registry").glob("*.hcd"))


def _claims():
    out = []
    for path in CHIPS:
        hcd = load_hcd(path)
        for field in hcd.performance_numbers():
            src = hcd.source_of(field)
            if src is not None and src.kind == "microbenchmark" and src.table:
                out.append(pytest.param(path, field, src.table, id=f"{path.stem}:{field}"))
    return out or [pytest.param(None, None, None, id="none-yet")]


@pytest.mark.parametrize("path,field,table", _claims())
def test_a_microbenchmark_number_is_what_its_table_gives(path, field, table):
    if path is None:
        pytest.skip("no bundled HCD names a microbenchmark table yet")
    hcd = load_hcd(path)
    csv = bundled_path("measurements") / "microbench" / f"{table}.csv"
    assert csv.is_file(), f"{path.name}: {field} names table {table!r}: no measurements/microbench/{table}.csv"
    cal = calibrate(hcd, [load_table(csv)])
    assert field in cal.numbers, (f"{path.name}: {field} names {table}.csv, which gives no {field} for "
                                  f"{hcd.chip.name} (it gives {sorted(cal.numbers)}; {cal.warnings})")
    stated = hcd.performance_numbers()[field]
    assert stated == pytest.approx(cal.numbers[field].value, rel=1e-3), (
        f"{path.name}: {field} is {stated:g}; calibrate derives {cal.numbers[field].value:g} from {table}.csv "
        f"({cal.numbers[field].note}); write that, or name the right table")


@pytest.mark.parametrize("path", CHIPS, ids=[p.stem for p in CHIPS])
def test_no_bundled_number_is_fitted(path):
    hcd = load_hcd(path)
    assert hcd.fitted_rows() == frozenset(), f"{path.name}: fitted on {sorted(hcd.fitted_rows())}"
