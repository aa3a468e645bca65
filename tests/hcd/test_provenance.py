"""HCD format 1.2: ``sources`` and ``provenance`` parse, every problem is located, the fitted
and unstated warnings fire, 1.0/1.1 hashes stay, and ``hcd show`` names each number's source."""

from __future__ import annotations

import json
import typing

import pytest
from click.testing import CliRunner

from torchfl.hcd import HCD, check_hcd_text, load_hcd, load_hcd_text
from torchfl.hcd.model import Execution
from torchfl.hcd.provenance import PERFORMANCE_FIELDS, EXECUTION_FIELDS, Source
from torchfl.resources import bundled_path

BASE = """\
chip:
  name: TEST-12
  vendor: Test
  version: 1.0.0
  device_type: test12
compute_units:
  fp16:
    count: 4
    peak_tflops: 100
    sustained_fraction: 0.7
memory:
  on_chip_cache:
    size_kb: 1024
    bandwidth_gb_per_s: 5000
  off_chip_memory:
    bandwidth_gb_per_s: 1000
    size_gb: 16
    sustained_fraction: 0.8
tensor:
  max_rank: 4
  supported_dtypes: [torch.float16]
  default_layout: NCHW
constraints:
  max_batch_size: 64
  max_sequence_length: 4096
  memory_alignment_bytes: 64
execution:
  launch_overhead_us: 5
"""

SOURCES = """\
sources:
  ds:
    kind: datasheet
    ref: "Test datasheet (2026), dense peaks"
  mb-gemm:
    kind: microbenchmark
    benchmark: gemm-sweep
    ref: "a published GEMM sweep, cuBLAS 12.4"
    table: microbench_test_gemm
  cls:
    kind: assumption
    ref: "class default for a test chip"
  fit:
    kind: fitted
    ref: "off-chip share fitted on one row"
    rows: [llmcompass_gelu_mi210, src-x]
"""

PROVENANCE = """\
provenance:
  compute_units.fp16.count: ds
  compute_units.fp16.peak_tflops: ds
  compute_units.fp16.sustained_fraction: mb-gemm
  memory.on_chip_cache.size_kb: ds
  memory.on_chip_cache.bandwidth_gb_per_s: cls
  memory.off_chip_memory.bandwidth_gb_per_s: ds
  memory.off_chip_memory.sustained_fraction: fit
  execution.launch_overhead_us: cls
"""

V12 = BASE + SOURCES + PROVENANCE


def diags(text, severity=None):
    out = check_hcd_text(text, "chip.hcd").diagnostics
    return [d for d in out if severity is None or d.severity == severity]


def line_of(text, needle, nth=0):
    """1-based line of the ``nth`` line containing ``needle``."""
    hits = [i + 1 for i, line in enumerate(text.splitlines()) if needle in line]
    return hits[nth]


# --------------------------------------------------------------------------- parse and API


def test_a_12_file_parses_into_sources_and_provenance():
    h = load_hcd_text(V12)
    assert h.format_version == "1.2"
    assert set(h.sources) == {"ds", "mb-gemm", "cls", "fit"}
    mb = h.sources["mb-gemm"]
    assert isinstance(mb, Source) and (mb.kind, mb.benchmark, mb.table) == ("microbenchmark", "gemm-sweep",
                                                                            "microbench_test_gemm")
    assert h.sources["fit"].rows == ("llmcompass_gelu_mi210", "src-x")
    assert h.provenance["execution.launch_overhead_us"] == "cls"
    assert h.source_of("compute_units.fp16.peak_tflops").ref.startswith("Test datasheet")
    assert h.source_of("memory.off_chip_memory.size_gb") is None
    assert h.kind_of("compute_units.fp16.sustained_fraction") == "microbenchmark"
    assert h.kind_of("memory.on_chip_cache.bandwidth_gb_per_s") == "assumption"
    assert h.kind_of("memory.off_chip_memory.size_gb") == "unstated"
    assert h.fitted_rows() == frozenset({"llmcompass_gelu_mi210", "src-x"})
    nums = h.performance_numbers()
    assert nums["compute_units.fp16.peak_tflops"] == 100.0 and nums["execution.launch_overhead_us"] == 5.0
    assert "memory.off_chip_memory.size_gb" not in nums      # capacity: not a number the cost model reads
    assert set(nums) <= set(PERFORMANCE_FIELDS)


def test_sources_are_frozen():
    h = load_hcd_text(V12)
    with pytest.raises(Exception):
        h.sources["ds"].kind = "fitted"


def test_a_fitted_source_no_path_uses_marks_no_row():
    text = V12.replace("off_chip_memory.sustained_fraction: fit", "off_chip_memory.sustained_fraction: ds")
    h = load_hcd_text(text)
    assert h.fitted_rows() == frozenset()
    assert not [d for d in diags(text, "warning") if "fitted" in d.message]


def test_a_11_file_has_empty_sections_and_unstated_numbers():
    h = load_hcd_text(BASE)
    assert h.format_version == "1.1" and h.sources == {} and h.provenance == {}
    assert h.kind_of("compute_units.fp16.peak_tflops") == "unstated" and h.fitted_rows() == frozenset()
    assert not diags(BASE, "warning")          # no provenance warnings for a file that is not 1.2


def test_performance_fields_cover_every_execution_number():
    numeric = set()
    for name, info in Execution.model_fields.items():
        args = typing.get_args(info.annotation) or (info.annotation,)
        if any(a in (int, float) for a in args):
            numeric.add(name)
    assert numeric == set(EXECUTION_FIELDS)
    assert "compute_units.int8.peak_tops" in PERFORMANCE_FIELDS
    assert "compute_units.bf16.sustained_fraction" in PERFORMANCE_FIELDS
    assert len(set(PERFORMANCE_FIELDS)) == len(PERFORMANCE_FIELDS)


# --------------------------------------------------------------------------- hashes


def test_bundled_files_keep_their_hash_through_the_12_model():
    """A file without the sections has no 1.2 keys in its canonical form (the pinned 1.0/1.1
    hashes of tests/hcd/test_format_11*.py hold), and empty sections change nothing."""
    for path in sorted(bundled_path("hcd_registry").glob("*.hcd")):
        h = load_hcd(path)
        if h.format_version == "1.2":
            continue
        canonical = h.canonical()
        assert "sources" not in canonical and "provenance" not in canonical
        again = load_hcd_text(path.read_text() + "\nsources: {}\nprovenance: {}\n")
        assert again.content_hash() == h.content_hash() and again.format_version == h.format_version


def test_sources_are_part_of_the_hash_and_round_trip_through_canonical_json():
    h = load_hcd_text(V12)
    assert h.content_hash() != load_hcd_text(BASE).content_hash()
    assert h.canonical()["sources"]["fit"]["rows"] == ["llmcompass_gelu_mi210", "src-x"]
    back = HCD.model_validate_json(h.canonical_json())      # the registry's fallback path
    assert back.content_hash() == h.content_hash() and back.fitted_rows() == h.fitted_rows()
    changed = load_hcd_text(V12.replace('ref: "class default for a test chip"', 'ref: "another default"'))
    assert changed.content_hash() != h.content_hash()


def test_provenance_does_not_move_a_prediction():
    from torchfl.kernels.chip import ChipModel

    a, b = ChipModel.from_hcd(load_hcd_text(BASE)), ChipModel.from_hcd(load_hcd_text(V12))
    assert (a.launch_s, a.sustained, a.offchip_sustained) == (b.launch_s, b.sustained, b.offchip_sustained)


# --------------------------------------------------------------------------- errors, located


@pytest.mark.parametrize("old,new,needle,path,words", [
    ("kind: datasheet", "kind: datashet", "kind: datashet", "sources.ds.kind",
     ["unknown source kind 'datashet'", "did you mean 'datasheet'"]),
    ("benchmark: gemm-sweep", "benchmark: gemm-swep", "benchmark: gemm-swep", "sources.mb-gemm.benchmark",
     ["unknown benchmark 'gemm-swep'", "did you mean 'gemm-sweep'"]),
    ("bandwidth_gb_per_s: cls", "bandwidth_gb_per_s: clz", "bandwidth_gb_per_s: clz",
     "provenance.memory.on_chip_cache.bandwidth_gb_per_s", ["unknown source 'clz'", "did you mean 'cls'"]),
    ("  memory.on_chip_cache.size_kb: ds", "  memory.on_chip_cache.size_k: ds", "size_k: ds",
     "provenance.memory.on_chip_cache.size_k", ["names no number", "did you mean 'memory.on_chip_cache.size_kb'"]),
    ("  compute_units.fp16.count: ds", "  compute_units.bf16.count: ds", "bf16.count: ds",
     "provenance.compute_units.bf16.count", ["names no number present in the file"]),
    ("    benchmark: gemm-sweep\n", "", "kind: microbenchmark", "sources.mb-gemm.kind",
     ["states which benchmark", "gemm-sweep"]),
    ("    rows: [llmcompass_gelu_mi210, src-x]\n", "", "kind: fitted", "sources.fit.kind",
     ["names the rows it was fitted on"]),
    ('    ref: "class default for a test chip"', '    refs: "class default"', "refs:", "sources.cls.refs",
     ["unknown field 'refs'", "did you mean 'ref'"]),
    ("  cls:\n", "  cl s:\n", "cl s:", "sources.cl s", ["source id 'cl s' is not valid"]),
    ("    table: microbench_test_gemm\n", "    table: microbench_test_gemm\n    rows: [x]\n", "rows: [x]",
     "sources.mb-gemm.rows", ["rows go with kind fitted"]),
    ("  ds:\n    kind: datasheet\n", "  ds:\n    kind: datasheet\n    benchmark: other\n", "benchmark: other",
     "sources.ds.benchmark", ["benchmark goes with kind microbenchmark"]),
    ("    rows: [llmcompass_gelu_mi210, src-x]", "    rows: llmcompass_gelu_mi210", "rows: llmcompass",
     "sources.fit.rows", ["expected a"]),
    ("  execution.launch_overhead_us: cls", "  execution.launch_overhead_us: 3", "launch_overhead_us: 3",
     "provenance.execution.launch_overhead_us", ["expected a string"]),
])
def test_every_error_is_located_with_a_fix(old, new, needle, path, words):
    text = V12.replace(old, new)
    assert text != V12
    errs = diags(text, "error")
    assert errs, text
    hit = [d for d in errs if d.path == path]
    assert hit, [str(d) for d in errs]
    d = hit[0]
    assert d.line == line_of(text, needle) and d.column >= 1 and d.file == "chip.hcd"
    for w in words:
        assert w in d.message, d.message
    report = check_hcd_text(text, "chip.hcd")
    assert report.hcd is None and not report.ok


def test_all_errors_at_once_never_a_traceback():
    text = (V12.replace("kind: datasheet", "kind: nope").replace("bandwidth_gb_per_s: cls", "bandwidth_gb_per_s: q")
            .replace("  memory.on_chip_cache.size_kb: ds", "  memory.size: ds"))
    assert len(diags(text, "error")) == 3


@pytest.mark.parametrize("tail", [
    "sources: [a, b]\n", "sources: 3\n", "provenance: [x]\n", "sources:\n  a: 3\n",
    "sources:\n  a:\n    kind: [datasheet]\n    ref: r\n", "provenance:\n  1: ds\n",
    "sources:\n  a: {kind: fitted, ref: r, rows: [1, 2]}\nprovenance:\n  compute_units.fp16.count: a\n",
])
def test_hostile_sections_are_errors_not_tracebacks(tail):
    errs = diags(BASE + tail, "error")
    assert errs and all(d.line >= 1 for d in errs)


# --------------------------------------------------------------------------- warnings


def test_a_fitted_number_is_a_warning_naming_its_rows():
    warns = diags(V12, "warning")
    fitted = [d for d in warns if "fitted on rows" in d.message]
    assert len(fitted) == 1
    d = fitted[0]
    assert d.path == "sources.fit.kind" and d.line == line_of(V12, "kind: fitted")
    assert "llmcompass_gelu_mi210, src-x" in d.message and "in-sample" in d.message
    assert "memory.off_chip_memory.sustained_fraction" in d.message
    assert load_hcd_text(V12).warnings       # a warning does not refuse the file


def test_a_number_without_provenance_is_a_warning_at_the_number():
    text = V12.replace("  execution.launch_overhead_us: cls\n", "")
    warns = [d for d in diags(text, "warning") if "no provenance" in d.message]
    assert [d.path for d in warns] == ["execution.launch_overhead_us"]
    assert warns[0].line == line_of(text, "launch_overhead_us: 5")
    full = [d for d in diags(V12, "warning") if "no provenance" in d.message]
    assert full == []


def test_validate_cli_warns_and_exits_zero(tmp_path):
    from torchfl.cli.main import cli

    f = tmp_path / "c.hcd"
    f.write_text(V12)
    res = CliRunner().invoke(cli, ["hcd", "validate", str(f)])
    assert res.exit_code == 0, res.output
    assert "warning: sources.fit.kind" in res.output and "valid: TEST-12 1.0.0 (1 warning)" in res.output


# --------------------------------------------------------------------------- schema, diff, show


def test_schema_knows_12():
    from torchfl.hcd.schema import hcd_json_schema

    s = hcd_json_schema()
    assert "1.2" in s["title"]
    assert {"sources", "provenance"} <= set(s["properties"])
    src = s["$defs"]["Source"]["properties"]
    assert src["kind"]["enum"] == ["datasheet", "microbenchmark", "assumption", "fitted"]
    assert src["benchmark"]["anyOf"][0]["enum"][0] == "gemm-sweep" and src["benchmark"]["anyOf"][1] == {"type": "null"}


def test_diff_gives_provenance_paths_no_unit():
    from torchfl.registry.diff import Change

    assert str(Change("provenance.compute_units.fp16.sustained_fraction", "changed", "a", "b")) == \
        'provenance.compute_units.fp16.sustained_fraction: "a" -> "b"'
    assert str(Change("compute_units.fp16.sustained_fraction", "changed", 0.5, 0.6)).endswith("(fraction of peak)")


def test_show_prints_each_number_with_kind_and_ref_within_100_columns(tmp_path):
    from torchfl.cli.main import cli

    f = tmp_path / "c.hcd"
    f.write_text(V12)
    res = CliRunner().invoke(cli, ["hcd", "show", str(f)], env={"COLUMNS": None})
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "format 1.2" in res.output
    row = next(line for line in lines if "fp16.sustained_fraction" in line)
    assert "microbenchmark" in row and "mb-gemm: a published GEMM sweep" in row
    assert "[gemm-sweep, table" in res.output                    # rich markup escaped, not swallowed
    row = next(line for line in lines if "on_chip_cache.bandwidth_gb_per_s" in line)
    assert "assumption" in row and "cls: class default" in row
    assert "fitted" in next(line for line in lines if "off_chip_memory.sustained_fraction" in line)
    js = json.loads(CliRunner().invoke(cli, ["hcd", "show", "--json", str(f)]).output)
    assert js["format_version"] == "1.2"
    assert js["performance_numbers"]["execution.launch_overhead_us"] == {"value": 5.0, "kind": "assumption",
                                                                         "source": "cls"}


def test_show_a_registry_chip_by_name(tmp_path):
    from torchfl.cli.main import cli

    url = f"sqlite:///{tmp_path / 'reg.db'}"
    runner = CliRunner()
    assert runner.invoke(cli, ["registry", "init", "--registry", url]).exit_code == 0
    res = runner.invoke(cli, ["hcd", "show", "NPU-V3", "--registry", url])
    assert res.exit_code == 0, res.output
    assert "performance numbers and their sources" in res.output and "unstated" in res.output
    bad = runner.invoke(cli, ["hcd", "show", "NO-SUCH-CHIP", "--registry", url])
    assert bad.exit_code == 2 and "neither an HCD file nor a chip" in bad.output
    assert "Traceback" not in bad.output
