"""The fidelity runs torchfl ships (measurements/evidence/fidelity_runs.json, written by
tools/bundle_fidelity.py): they belong to the bundled chips as they are, they are what the
planner predicts today, and seeding a registry imports them once, so a fresh install's
confidence line quotes each checked chip's out-of-sample error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchfl.fidelity.oneop import predict
from torchfl.fidelity.tables import load_table
from torchfl.hcd import load_hcd
from torchfl.registry import Registry
from torchfl.registry.bundled_evidence import BUNDLED_MARK, bundled_runs, seed_fidelity
from torchfl.registry.fidelity import checked_line, fidelity_runs, fidelity_summary
from torchfl.resources import bundled_hcds, bundled_path

REGENERATE = "regenerate it: python tools/bundle_fidelity.py (about 10 minutes)"


@pytest.fixture(scope="module")
def runs():
    found = bundled_runs()
    assert found, "measurements/evidence/fidelity_runs.json is missing or empty; " + REGENERATE
    return {r["chip_name"]: r for r in found}


def test_every_run_scores_a_bundled_chip_as_it_is_and_every_bundled_table(runs):
    chips = {h.chip.name: h for h in map(load_hcd, bundled_hcds())}
    for name, run in runs.items():
        hcd = chips[name]
        assert (run["chip_version"], run["chip_hash"]) == (hcd.chip.version, hcd.content_hash()), (
            f"{name}'s bundled file changed since its run was scored; " + REGENERATE)
    tables = {p.name for p in bundled_path("measurements").glob("*.csv")}
    scored = {t for run in runs.values() for t, _ in run["tables"]}
    assert scored == tables, f"bundled tables not scored: {sorted(tables - scored)}; " + REGENERATE
    # A100, H100 and MI210 have op tables of three sources: each is checked out of sample
    for name in ("A100-SXM4-80GB", "H100-SXM5-80GB", "MI210"):
        held = [r for r in runs[name]["rows"] if r["predicted_s"] is not None and not r["in_sample"]]
        assert len(held) >= 100, name


def _rows(table: str):
    return {r.line: r for r in load_table(bundled_path("measurements") / table).rows}


def test_a_sample_of_the_rows_is_what_the_planner_predicts_today(runs):
    """Every 40th single-op row of each chip re-planned now: equal to the stored prediction
    (a planner or HCD change that moves predictions makes the file stale: regenerate it)."""
    from torchfl.planner.target import resolve_target

    reg = Registry(None)
    checked = 0
    for name, run in runs.items():
        target = resolve_target(name, reg)
        rows = [r for r in run["rows"] if not r["table_name"].startswith("lm_")]
        for stored in rows[::40]:
            row = _rows(stored["table_name"])[stored["line"]]
            now = predict(row, target)
            if stored["predicted_s"] is None:
                assert now.predicted_s is None, (name, stored["table_name"], stored["line"], REGENERATE)
            else:
                assert now.predicted_s == pytest.approx(stored["predicted_s"], rel=1e-6), (
                    f"{name} {stored['table_name']}:{stored['line']}: predicted {now.predicted_s} s now, "
                    f"{stored['predicted_s']} s in the bundled run; " + REGENERATE)
            checked += 1
    assert checked >= 15


def test_a_seeded_registry_quotes_the_bundled_check_once(tmp_path, runs):
    reg = Registry(f"sqlite:///{tmp_path}/r.db")
    reg.init(seed=True)
    run = runs["A100-SXM4-80GB"]
    summary = fidelity_summary(reg, "A100-SXM4-80GB")
    held = [r for r in run["rows"] if r["predicted_s"] is not None and not r["in_sample"]]
    assert summary["state"] == "checked" and summary["out_of_sample"] == len(held)
    assert summary["tool_version"].endswith(BUNDLED_MARK)
    assert checked_line(summary).startswith(f"A100-SXM4-80GB: predictions checked on {len(held)} published")
    assert seed_fidelity(reg) == []                        # a second seed adds nothing
    reg.init(seed=True)
    assert len(fidelity_runs(reg, chip="A100-SXM4-80GB")) == 1
    reg.close()


def test_a_chip_with_other_numbers_under_the_same_version_is_not_credited(tmp_path, runs):
    """A team registry that published its own MI210 1.2.0 (other numbers) keeps it unchecked."""
    src = next(p for p in bundled_hcds() if load_hcd(p).chip.name == "MI210")
    text = src.read_text().replace("launch_overhead_us: 22 ", "launch_overhead_us: 23 ")
    assert text != src.read_text()
    reg = Registry(f"sqlite:///{tmp_path}/r.db")
    reg.init()
    reg.import_texts([("mi210.hcd", text)])
    assert seed_fidelity(reg) == []
    assert fidelity_summary(reg, "MI210")["state"] == "unchecked"
    reg.close()
