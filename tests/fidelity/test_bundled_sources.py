"""The bundled measurement data of issue 47: microbenchmark tables (calibration) and published op
tables (evaluation) each name their source, licence and timing harness, load with the real loader,
and never share a row, so a score on an evaluation table is out of sample by construction."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from torchfl.fidelity.tables import load_table
from torchfl.hcd import load_hcd
from torchfl.resources import bundled_hcds, bundled_path

MEASUREMENTS = Path(bundled_path("measurements"))
MICRO = MEASUREMENTS / "microbench"
BENCHMARKS = {"gemm-sweep", "copy-bandwidth", "launch-latency"}
EVAL_PREFIXES = ("neusight_", "liger_")


def _comments(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        out.append(line.lstrip("#").strip())
    return out


def _rows(path: Path) -> list[dict]:
    lines = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    return list(csv.DictReader(lines))


def _chips() -> set[str]:
    return {load_hcd(p).chip.name for p in bundled_hcds()}


MICRO_TABLES = sorted(MICRO.glob("*.csv"))
EVAL_TABLES = sorted(p for p in MEASUREMENTS.glob("*.csv") if p.name.startswith(EVAL_PREFIXES))


def test_there_are_microbenchmark_and_evaluation_tables():
    assert {p.name.rsplit("_", 1)[1] for p in MICRO_TABLES} >= {"gemm.csv", "copy.csv", "launch.csv"}
    assert len(EVAL_TABLES) >= 12
    # three independent published sources of kernel-level timings: LLMCompass, NeuSight, Liger-Kernel
    assert {p.name.split("_", 1)[0] for p in MEASUREMENTS.glob("*.csv") if not p.name.startswith("lm_")} >= {
        "llmcompass", "neusight", "liger"}


@pytest.mark.parametrize("path", MICRO_TABLES, ids=lambda p: p.name)
def test_microbenchmark_table_states_kind_source_licence_harness(path):
    head = _comments(path)
    kinds = [c.split(":", 1)[1].strip() for c in head if c.startswith("microbenchmark:")]
    assert len(kinds) == 1 and kinds[0] in BENCHMARKS, path
    text = " ".join(head).lower()
    assert re.search(r"\bsources?:", text) and "licence" in text and "harness" in text, path
    op = {"gemm-sweep": "matmul", "copy-bandwidth": "copy", "launch-latency": "launch"}[kinds[0]]
    rows = _rows(path)
    assert rows and all(r["op"] == op and r["source"].strip() and float(r["seconds"]) > 0 for r in rows), path
    # every row carries its published rate in the comment line above it
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if line and not line.startswith("#") and not line.startswith("chip,"):
            assert lines[i - 1].startswith("# ") and re.search(r"(TFLOP/s|GB/s| us)", lines[i - 1]), (path, i)


@pytest.mark.parametrize("path", EVAL_TABLES, ids=lambda p: p.name)
def test_evaluation_table_loads_and_states_source_licence_harness(path):
    table = load_table(path)
    text = "\n".join(table.comments)
    assert "EVALUATION ONLY" in text and "harness" in text.lower()
    assert ("MIT License" in text and "NeuSight" in text) or ("BSD 2-CLAUSE" in text and "Liger" in text)
    assert 1 <= len(table.rows) <= 300
    assert {r.chip for r in table.rows} <= _chips()
    assert not table.calibrates and table.harness_s == 0.0


def test_bmm_and_linear_aliases_resolve_to_their_overloads():
    ops = {r.alias: r.op for p in EVAL_TABLES for r in load_table(p).rows}
    assert ops["bmm"] == "aten.bmm.default" and ops["linear"] == "aten.linear.default"
    row = next(r for r in load_table(MEASUREMENTS / "neusight_linear_h100.csv").rows)
    assert len(row.shapes) == 3 and row.shapes[1][1] == row.shapes[0][-1] and row.shapes[2] == (row.shapes[1][0],)


def test_no_calibration_row_is_an_evaluation_row():
    """A microbenchmark measurement that also sat in a scored table would make its score in-sample (the
    same shape measured by another source is fine: LLMCompass times the A100's 8192^3 bf16 GEMM too)."""
    def key(r):
        return (r["chip"], r["op"], r["shapes"], r["dtype"], float(r["seconds"]))

    calibration = {key(r) for p in MICRO_TABLES for r in _rows(p)}
    scored = {key(r) for p in MEASUREMENTS.glob("*.csv") for r in _rows(p)}
    assert calibration and scored and not calibration & scored
