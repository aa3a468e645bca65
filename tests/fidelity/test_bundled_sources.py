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


@pytest.mark.parametrize("path", [p for p in MICRO_TABLES if p.name.endswith("_gemm.csv")], ids=lambda p: p.name)
def test_gemm_tables_load_and_rates_stay_below_the_datasheet_peak(path):
    table = load_table(path)
    for row in table.rows:
        if row.chip not in _chips():
            continue
        hcd = next(load_hcd(p) for p in bundled_hcds() if load_hcd(p).chip.name == row.chip)
        (m, k), (_, n) = row.shapes
        rate = 2.0 * m * k * n / row.seconds
        unit = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[str(row.dtype).replace("torch.", "")]
        peak = getattr(hcd.compute_units, unit).peak_tflops * 1e12
        assert 0.3 * peak < rate <= peak, (path.name, row.line, rate / peak)


@pytest.mark.parametrize("path", EVAL_TABLES, ids=lambda p: p.name)
def test_evaluation_table_loads_and_states_source_licence_harness(path):
    table = load_table(path)
    text = "\n".join(table.comments)
    assert "EVALUATION ONLY" in text and "harness" in text.lower()
    assert ("MIT License" in text and "NeuSight" in text) or ("BSD 2-CLAUSE" in text and "Liger" in text)
    assert 1 <= len(table.rows) <= 300
    assert {r.chip for r in table.rows} <= _chips()
    assert not table.calibrates and table.harness_s == 0.0


def test_no_bundled_op_table_calibrates_a_chip():
    """Issue 47: no bundled number is fitted to an op table, so none may claim to be (the legacy
    ``# calibrates:`` header marks a table in-sample)."""
    tables = [load_table(p) for p in MEASUREMENTS.glob("*.csv") if not p.name.startswith("lm_")]
    assert tables and not [t.name for t in tables if t.calibrates or t.in_sample]


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


REAL_CHIPS = ("a100_sxm4_80gb", "h100_sxm5_80gb", "mi210", "mi300x", "gaudi2", "tpu_v5e", "ascend_910b",
              "jetson_agx_orin_64gb")
UNITS = ("fp16", "bf16", "fp32", "int8")
DTYPE_UNIT = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}


def _real(stem):
    return load_hcd(Path(bundled_path("hcd_registry")) / f"{stem}.hcd")


@pytest.mark.parametrize("stem", REAL_CHIPS)
def test_every_performance_number_of_a_real_chip_states_its_source_and_none_is_fitted(stem):
    hcd = _real(stem)
    assert hcd.format_version == "1.2"
    kinds = {path: hcd.kind_of(path) for path in hcd.performance_numbers()}
    assert kinds and "unstated" not in kinds.values() and "fitted" not in kinds.values(), kinds
    assert not hcd.fitted_rows()
    # every unit a sustained rate, the memory a sustained share, launch and matrix-launch costs stated
    for unit in UNITS:
        if getattr(hcd.compute_units, unit, None) is not None:
            assert f"compute_units.{unit}.sustained_fraction" in kinds, unit
    for path in ("memory.off_chip_memory.sustained_fraction", "execution.launch_overhead_us",
                 "execution.matrix_launch_overhead_us"):
        assert path in kinds, path


def _derived(hcd, path, table):
    """What a microbenchmark table says for one number (the rows hide no launch: see each table's
    ``timing``): best GEMM row over the unit's peak, best copy over the off-chip peak,
    median launch row."""
    rows = [r for r in _rows(MICRO / f"{table}.csv") if r["chip"] == hcd.chip.name]
    if path.endswith("sustained_fraction") and path.startswith("compute_units."):
        unit = path.split(".")[1]
        rates = []
        for r in rows:
            if r["op"] == "matmul" and DTYPE_UNIT[r["dtype"]] == unit:
                (m, k), (_, n) = [tuple(int(d) for d in s.split("x")) for s in r["shapes"].split(";")]
                rates.append(2.0 * m * k * n / float(r["seconds"]))
        return max(rates) / (getattr(hcd.compute_units, unit).peak_tflops * 1e12)
    if path == "memory.off_chip_memory.sustained_fraction":
        size = {"float32": 4, "float16": 2, "bfloat16": 2}
        rates = [2.0 * int(r["shapes"]) * size[r["dtype"]] / float(r["seconds"]) for r in rows if r["op"] == "copy"]
        return max(rates) / (hcd.memory.off_chip_memory.bandwidth_gb_per_s * 1e9)
    if path == "execution.launch_overhead_us":
        return sorted(float(r["seconds"]) for r in rows if r["op"] == "launch")[len(rows) // 2] * 1e6
    raise AssertionError(f"{path}: no derivation from a {table} table")


@pytest.mark.parametrize("stem", REAL_CHIPS)
def test_a_microbenchmark_number_that_names_a_table_is_what_the_table_says(stem):
    hcd = _real(stem)
    checked = 0
    for path, value in hcd.performance_numbers().items():
        src = hcd.source_of(path)
        if src is None or src.kind != "microbenchmark" or not src.table:
            continue
        assert (MICRO / f"{src.table}.csv").is_file(), (path, src.table)
        assert value == pytest.approx(_derived(hcd, path, src.table), abs=5e-5 if value < 1 else 1e-6), path
        checked += 1
    assert checked or stem in ("tpu_v5e", "ascend_910b", "jetson_agx_orin_64gb")


def test_the_mi210_numbers_fitted_to_op_tables_are_gone():
    mi = _real("mi210")
    assert mi.compute_units.fp16.sustained_fraction != 0.6667
    assert mi.memory.off_chip_memory.sustained_fraction != 0.3795
    assert "llmcompass" not in " ".join(s.ref.lower() + str(s.table) for s in mi.sources.values()
                                        if s.kind == "microbenchmark" and s.benchmark == "gemm-sweep")
