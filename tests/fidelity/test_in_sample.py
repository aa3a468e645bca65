"""In-sample vs out-of-sample (issue 47): a row a chip number was fitted on (format-1.2
``fitted`` provenance naming its table or its source, or a legacy ``# calibrates:`` table) is
scored apart, recorded as in-sample, and plan explain quotes the out-of-sample figure."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.fidelity.oneop import Prediction
from torchfl.fidelity.sample import in_sample
from torchfl.fidelity.score import IN_SAMPLE, OUT_OF_SAMPLE, overall, score
from torchfl.fidelity.tables import make_row

CHIP = """\
chip: {{name: TEST-GPU, vendor: Test, version: 1.0.0, device_type: testgpu}}
compute_units:
  fp16: {{count: 100, peak_tflops: 300, sustained_fraction: 0.7}}
  fp32: {{count: 100, peak_tflops: 20}}
memory:
  on_chip_cache: {{size_kb: 40960, bandwidth_gb_per_s: 8000}}
  off_chip_memory: {{bandwidth_gb_per_s: 2000, size_gb: 80, sustained_fraction: 0.8}}
tensor: {{max_rank: 8, supported_dtypes: [torch.float16, torch.float32], default_layout: NCHW}}
constraints: {{max_batch_size: 65536, max_sequence_length: 65536, memory_alignment_bytes: 256}}
execution: {{launch_overhead_us: 10}}
sources:
  ds: {{kind: datasheet, ref: "Test datasheet"}}
  fit: {{kind: fitted, ref: "off-chip share fitted on rows", rows: [{rows}]}}
provenance:
  memory.off_chip_memory.sustained_fraction: {use}
"""

FITTED = """# rows a number was fitted on (synthetic)
chip,op,shapes,dtype,args,seconds,source
TEST-GPU,softmax,4096x1024,float16,,2.0e-05,fit-src
TEST-GPU,softmax,8192x1024,float16,,3.0e-05,fit-src
"""
HELD = """# source: held-out rows (synthetic) [see the header]
chip,op,shapes,dtype,args,seconds,source
TEST-GPU,matmul,4096x4096;4096x4096,float16,,6.0e-04,held-a
TEST-GPU,softmax,16384x1024,float16,,5.0e-05,held-b
"""
LEGACY = """# calibrates: TEST-GPU something (legacy header)
chip,op,shapes,dtype,args,seconds,source
TEST-GPU,softmax,2048x1024,float16,,1.5e-05,legacy
"""


def _row(file="t.csv", source="s", chip="C", seconds=1e-3):
    return make_row(chip, "matmul", "8x8;8x8", "float16", "", seconds, source, file=file, line=2)


# --------------------------------------------------------------------------- the rule


def test_the_rule_reads_table_stems_sources_and_marks():
    fitted = frozenset({"llmcompass_gelu_mi210", "src-x"})
    assert in_sample(_row("measurements/llmcompass_gelu_mi210.csv"), fitted)
    assert in_sample(_row("other.csv", source="src-x"), fitted)
    assert not in_sample(_row("other.csv", source="src-y"), fitted)
    assert not in_sample(_row("llmcompass_gelu_mi210_more.csv"), fitted)      # a stem, not a prefix
    assert in_sample(_row("mb/a100_gemm.csv"), frozenset(), frozenset({"a100_gemm"}))


def test_scores_keep_in_and_out_of_sample_apart():
    preds = [Prediction(_row("fit.csv", seconds=1e-3), "C", 2e-3), Prediction(_row("fit.csv", seconds=1e-3), "C", 2e-3),
             Prediction(_row("held.csv", seconds=1e-3), "C", 1.1e-3)]
    scores = score(preds, in_sample=lambda p: p.row.file == "fit.csv")
    assert [(s.sample, s.rows) for s in scores] == [(OUT_OF_SAMPLE, 1), (IN_SAMPLE, 2)]
    assert overall(scores, "C").mean_abs_error == pytest.approx(0.1)           # never the 100% in-sample rows
    assert overall(scores, "C", IN_SAMPLE).mean_abs_error == pytest.approx(1.0)
    assert [s.sample for s in score(preds)] == [OUT_OF_SAMPLE]                 # no rule: all out of sample
    by_source = score(preds, by="source")
    assert [(s.family, s.by) for s in by_source] == [("s", "source")]
    with pytest.raises(ValueError, match="family, source"):
        score(preds, by="table")


# --------------------------------------------------------------------------- end to end


@pytest.fixture
def setup(tmp_path):
    from torchfl.registry import Registry
    from torchfl.resources import bundled_path

    url = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(url) as reg:
        reg.init()
        reg.import_texts([("test_gpu.hcd", CHIP.format(rows="fitted_rows", use="fit"))])
        reg.import_files(list(bundled_path("rules").glob("*.yaml")))
    files = {}
    for name, text in (("fitted_rows", FITTED), ("held_out", HELD), ("legacy_cal", LEGACY)):
        files[name] = tmp_path / f"{name}.csv"
        files[name].write_text(text)
    return url, files


def _run(url, files, *extra):
    args = ["fidelity", "--registry", url, *extra]
    for f in files:
        args += ["--table", str(f)]
    return CliRunner().invoke(cli, args)


def test_fitted_rows_are_in_sample_reported_recorded_and_explained_apart(setup):
    url, files = setup
    run = _run(url, files.values(), "--json", "--record")
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout)
    flags = {(p["row"]["where"].rsplit("/", 1)[-1]): p["in_sample"] for p in out["predictions"]}
    assert flags == {"fitted_rows.csv:3": True, "fitted_rows.csv:4": True, "held_out.csv:3": False,
                     "held_out.csv:4": False, "legacy_cal.csv:3": True}
    samples = {(s["sample"], s["family"]): s["rows"] for s in out["scores"]}
    assert samples == {(OUT_OF_SAMPLE, "matmul"): 1, (OUT_OF_SAMPLE, "softmax"): 1, (OUT_OF_SAMPLE, "all"): 2,
                       (IN_SAMPLE, "softmax"): 3}
    assert out["chips"]["TEST-GPU"]["fitted_rows"] == ["fitted_rows"]
    tables = {t["path"].rsplit("/", 1)[-1]: t["in_sample"] for t in out["tables"]}
    assert tables == {"fitted_rows.csv": False, "held_out.csv": False, "legacy_cal.csv": True}   # marked as a whole

    from torchfl.registry import Registry

    with Registry(url) as reg:
        with reg._read() as r:
            stored = sorted(r.rows("SELECT table_name, line, in_sample FROM fidelity_rows"))
    assert [(t, line, bool(s)) for t, line, s in stored] == [
        ("fitted_rows.csv", 3, True), ("fitted_rows.csv", 4, True), ("held_out.csv", 3, False),
        ("held_out.csv", 4, False), ("legacy_cal.csv", 3, True)]
    oos = next(s for s in out["scores"] if s["sample"] == OUT_OF_SAMPLE and s["family"] == "all")
    text = CliRunner().invoke(cli, ["plan", "explain", "mlp", "--chip", "TEST-GPU", "--registry", url])
    assert text.exit_code == 0, text.output
    flat = " ".join(text.output.split())
    assert (f"TEST-GPU: predictions checked on 2 published measurements, mean error "
            f"{oos['mean_abs_error']:.0%} out of sample (3 in-sample rows not counted)") in flat


def test_the_text_report_prints_two_tables(setup):
    url, files = setup
    run = _run(url, files.values())
    assert run.exit_code == 0, run.output
    assert "Out of sample: predicted vs measured" in run.output and "In sample (a number of the chip" in run.output
    assert run.output.index("Out of sample") < run.output.index("In sample")
    assert "worst TEST-GPU softmax (in-sample):" in run.output
    assert "in-sample rows (a chip number was fitted or calibrated on them) from: fitted_rows.csv, legacy_cal.csv" \
        in " ".join(run.output.split())


def test_a_fitted_source_id_marks_rows_of_any_table(setup, tmp_path):
    from torchfl.registry import Registry

    url, files = setup
    with Registry(url) as reg:
        reg.import_texts([("test_gpu.hcd", CHIP.format(rows="held-b", use="fit").replace("1.0.0", "1.1.0"))])
    out = json.loads(_run(url, [files["held_out"]], "--json").stdout)
    assert {p["row"]["source"]: p["in_sample"] for p in out["predictions"]} == {"held-a": False, "held-b": True}


def test_an_unused_fitted_source_marks_nothing(setup):
    from torchfl.registry import Registry

    url, files = setup
    with Registry(url) as reg:
        reg.import_texts([("test_gpu.hcd", CHIP.format(rows="fitted_rows", use="ds").replace("1.0.0", "1.2.0"))])
    out = json.loads(_run(url, [files["fitted_rows"]], "--json").stdout)
    assert not any(p["in_sample"] for p in out["predictions"])
    assert {s["sample"] for s in out["scores"]} == {OUT_OF_SAMPLE}


def test_by_source_groups_by_the_row_source_and_names_its_reference(setup):
    url, files = setup
    out = json.loads(_run(url, [files["held_out"], files["fitted_rows"]], "--json", "--by-source").stdout)
    groups = {(s["sample"], s["family"]) for s in out["scores"]}
    assert groups == {(OUT_OF_SAMPLE, "held-a"), (OUT_OF_SAMPLE, "held-b"), (OUT_OF_SAMPLE, "all"),
                      (IN_SAMPLE, "fit-src")}
    assert all(s["by"] == "source" for s in out["scores"])
    text = _run(url, [files["held_out"]], "--by-source")
    assert text.exit_code == 0, text.output
    assert "source held-a: held_out.csv: source: held-out rows (synthetic) [see the header]" in text.output
    assert "fit-src" not in text.output.split("source held-a")[1]      # only the sources scored are named
