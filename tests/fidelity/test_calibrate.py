"""fidelity/calibrate.py: chip numbers from microbenchmark tables (synthetic numbers: these
tests check the arithmetic), applied with microbenchmark provenance, and
``torchfl fidelity --calibrate-on`` scoring other tables with the calibrated chip."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.fidelity.calibrate import calibrate
from torchfl.fidelity.tables import TableError, load_tables, parse_table
from torchfl.hcd import load_hcd_text

CHIP = """\
chip: {name: TEST-GPU, vendor: Test, version: 1.0.0, device_type: testgpu}
compute_units:
  fp16: {count: 100, peak_tflops: 100}
  fp32: {count: 100, peak_tflops: 20}
memory:
  on_chip_cache: {size_kb: 40960, bandwidth_gb_per_s: 8000}
  off_chip_memory: {bandwidth_gb_per_s: 2000, size_gb: 80}
tensor: {max_rank: 8, supported_dtypes: [torch.float16, torch.float32], default_layout: NCHW}
constraints: {max_batch_size: 65536, max_sequence_length: 65536, memory_alignment_bytes: 256}
execution: {launch_overhead_us: 5}
"""

MATRIX_US = 24.98             # what the 64^3 row below leaves after its roofline time (rounded to 4 digits)
BIG = 2 * 8192 ** 3 / (0.70 * 100e12) + MATRIX_US * 1e-6     # fp16 at exactly 70% of peak, plus the launch
FP32 = 2 * 4096 ** 3 / (0.50 * 20e12) + MATRIX_US * 1e-6       # fp32 at 50%
COPY = 2 * 4 * 2 ** 28 / (0.80 * 2000e9) + 12e-6               # 1 GiB float32 read + write at 80%, plus the launch

GEMM = f"""# microbenchmark: gemm-sweep
# timing: call (one call timed from the host: each row holds a launch)
# source: a synthetic sweep (tests)
chip,op,shapes,dtype,args,seconds,source
TEST-GPU,matmul,8192x8192;8192x8192,float16,,{BIG!r},syn-gemm
TEST-GPU,matmul,4096x4096;4096x4096,float16,,{2 * 4096 ** 3 / (0.5 * 100e12) + 25e-6!r},syn-gemm
TEST-GPU,matmul,4096x4096;4096x4096,float32,,{FP32!r},syn-gemm
TEST-GPU,matmul,64x64;64x64,float16,,2.5e-05,syn-gemm
OTHER-GPU,matmul,8192x8192;8192x8192,float16,,1e-03,syn-other
"""
COPY_TABLE = f"""# microbenchmark: copy-bandwidth
# timing: call
# source: a synthetic copy test (tests)
chip,op,shapes,dtype,args,seconds,source
TEST-GPU,copy,268435456,float32,,{COPY!r},syn-copy
TEST-GPU,copy,1024,float32,,1.3e-05,syn-copy
"""
LAUNCH = """# microbenchmark: launch-latency
# source: a synthetic launch test (tests)
chip,op,shapes,dtype,args,seconds,source
TEST-GPU,launch,1;1,float16,,1.0e-05,syn-launch
TEST-GPU,launch,1;1,float16,,1.4e-05,syn-launch
TEST-GPU,launch,1;1,float16,,1.2e-05,syn-launch
"""
HELD = """# source: held-out rows (synthetic)
chip,op,shapes,dtype,args,seconds,source
TEST-GPU,matmul,6144x6144;6144x6144,float16,,7.0e-03,held
TEST-GPU,softmax,16384x1024,float16,,5.0e-05,held
"""


@pytest.fixture
def files(tmp_path):
    out = {}
    mb = tmp_path / "mb"
    mb.mkdir()
    for name, text in (("syn_gemm", GEMM), ("syn_copy", COPY_TABLE), ("syn_launch", LAUNCH)):
        out[name] = mb / f"{name}.csv"
        out[name].write_text(text)
    out["held"] = tmp_path / "held.csv"
    out["held"].write_text(HELD)
    return out


def _tables(files, *names):
    return load_tables([files[n] for n in names])


def test_the_numbers_come_out_of_the_arithmetic(files):
    cal = calibrate(load_hcd_text(CHIP), _tables(files, "syn_gemm", "syn_copy", "syn_launch"))
    n = {p: d.value for p, d in cal.numbers.items()}
    assert n["execution.launch_overhead_us"] == 12.0                   # the median launch row
    assert n["memory.off_chip_memory.sustained_fraction"] == 0.8       # the best copy, the launch taken off
    assert n["execution.matrix_launch_overhead_us"] == MATRIX_US        # 25 us less the 64^3 row's roofline
    assert n["compute_units.fp16.sustained_fraction"] == 0.70           # exactly 70% once the launch is off
    assert n["compute_units.fp32.sustained_fraction"] == 0.50
    assert set(n) == {"execution.launch_overhead_us", "memory.off_chip_memory.sustained_fraction",
                      "execution.matrix_launch_overhead_us", "compute_units.fp16.sustained_fraction",
                      "compute_units.fp32.sustained_fraction"}
    d = cal.numbers["compute_units.fp16.sustained_fraction"]
    assert d.table == "syn_gemm" and d.row.endswith("syn_gemm.csv:5") and "70.0% of 100" in d.note
    assert not cal.warnings


def test_without_a_latency_bound_row_the_files_launch_is_taken_off(files):
    """The same GEMM row without a latency-bound row and without a launch table: only the file's
    launch (5 us) is taken off, so the share is a little under 0.70 (the row holds 24.98 us)."""
    gemm = parse_table(GEMM.replace("TEST-GPU,matmul,64x64;64x64,float16,,2.5e-05,syn-gemm\n", ""), "g.csv")
    cal = calibrate(load_hcd_text(CHIP), [gemm])
    share = cal.numbers["compute_units.fp16.sustained_fraction"].value
    assert share == pytest.approx(2 * 8192 ** 3 / ((BIG - 5e-6) * 100e12), rel=1e-3) and share < 0.70
    assert "execution.matrix_launch_overhead_us" not in cal.numbers     # no latency-bound row


def test_a_row_above_the_peak_is_capped_with_a_warning(files):
    fast = parse_table("# microbenchmark: gemm-sweep\nchip,op,shapes,dtype,args,seconds,source\n"
                       f"TEST-GPU,matmul,8192x8192;8192x8192,float32,,{2 * 8192 ** 3 / 30e12!r},x\n", "fast.csv")
    cal = calibrate(load_hcd_text(CHIP), [fast])
    assert cal.numbers["compute_units.fp32.sustained_fraction"].value == 1.0
    (warning,) = cal.warnings
    assert "150.0% of the HCD's figure" in warning and "fast.csv:3" in warning


def test_a_kernel_timed_table_takes_no_launch_off(files):
    """The default (``# timing: kernel``, a device-timed or back-to-back harness): the row is
    the kernel's time; neither the launch nor a matrix launch is taken off or derived."""
    kernel = GEMM.replace("# timing: call (one call timed from the host: each row holds a launch)\n", "")
    copy = COPY_TABLE.replace("# timing: call\n", "# timing: kernel (CUDA events)\n")
    cal = calibrate(load_hcd_text(CHIP), [parse_table(kernel, "k.csv"), parse_table(copy, "c.csv"),
                                          *_tables(files, "syn_launch")])
    n = {p: d.value for p, d in cal.numbers.items()}
    assert n["compute_units.fp16.sustained_fraction"] == pytest.approx(2 * 8192 ** 3 / BIG / 100e12, rel=1e-3)
    assert n["compute_units.fp16.sustained_fraction"] < 0.70
    assert n["memory.off_chip_memory.sustained_fraction"] == pytest.approx(2 * 4 * 2 ** 28 / COPY / 2000e9, rel=1e-3)
    assert "execution.matrix_launch_overhead_us" not in n and not cal.warnings
    with pytest.raises(TableError, match=r"o.csv:\d+: timing: write '# timing: call'"):   # refused where it is read
        parse_table(GEMM.replace("# timing: call", "# timing: sometimes"), "o.csv")


def test_a_share_under_the_formats_floor_is_left_out_not_a_traceback():
    slow = parse_table("chip,op,shapes,dtype,args,seconds,source\nTEST-GPU,matmul,64x64;64x64,float32,,100.0,x\n"
                       "TEST-GPU,copy,1024,float32,,100.0,x\n", "slow.csv")
    hcd = load_hcd_text(CHIP)
    cal = calibrate(hcd, [slow])
    assert not cal.numbers and len(cal.warnings) == 2 and all("under the format's floor" in w for w in cal.warnings)
    assert cal.apply(hcd).content_hash() == hcd.content_hash()       # nothing to apply, nothing changed


def test_rows_of_other_chips_and_ops_are_left_out(files):
    odd = parse_table("chip,op,shapes,dtype,args,seconds,source\nTEST-GPU,softmax,8x8,float16,,1e-05,x\n"
                      "OTHER,launch,1;1,float16,,1e-05,x\n", "odd.csv")
    cal = calibrate(load_hcd_text(CHIP), [odd])
    assert not cal and "odd.csv:2: softmax 8x8 float16 is not a microbenchmark row" in cal.warnings[0]


def test_apply_gives_the_chip_with_microbenchmark_provenance(files):
    hcd = load_hcd_text(CHIP)
    cal = calibrate(hcd, _tables(files, "syn_gemm", "syn_copy", "syn_launch"))
    out = cal.apply(hcd)
    assert out.format_version == "1.2" and out.content_hash() != hcd.content_hash()
    assert out.compute_units.fp16.sustained_fraction == 0.70 and out.execution.launch_overhead_us == 12.0
    assert out.execution.matrix_launch_overhead_us == MATRIX_US
    src = out.source_of("compute_units.fp16.sustained_fraction")
    assert (src.kind, src.benchmark, src.table) == ("microbenchmark", "gemm-sweep", "syn_gemm")
    assert src.ref == "a synthetic sweep (tests)"
    assert out.source_of("execution.launch_overhead_us").benchmark == "launch-latency"
    assert out.source_of("memory.off_chip_memory.sustained_fraction").benchmark == "copy-bandwidth"
    assert out.kind_of("compute_units.fp16.peak_tflops") == "unstated"   # the rest as it was
    assert out.fitted_rows() == frozenset() and out.compute_units.fp16.peak_tflops == 100
    again = calibrate(out, _tables(files, "syn_gemm", "syn_copy", "syn_launch"))
    assert {p: d.value for p, d in again.numbers.items()} == {p: d.value for p, d in cal.numbers.items()}


def test_copy_and_launch_aliases_load():
    t = parse_table("chip,op,shapes,dtype,args,seconds,source\nC,copy,1024,float32,,1e-05,x\n"
                    "C,launch,1;1,float16,,1e-05,x\n", "a.csv")
    (copy, launch) = t.rows
    assert (copy.op, copy.alias, copy.shapes, copy.family) == ("aten.clone.default", "copy", ((1024,),), "copy")
    assert (launch.op, launch.alias, launch.shapes) == ("aten.add.Tensor", "launch", ((1,), (1,)))


# --------------------------------------------------------------------------- the command


@pytest.fixture
def url(tmp_path):
    from torchfl.registry import Registry
    from torchfl.resources import bundled_path

    u = f"sqlite:///{tmp_path / 'reg.db'}"
    with Registry(u) as reg:
        reg.init()
        reg.import_texts([("test_gpu.hcd", CHIP)])
        reg.import_files(list(bundled_path("rules").glob("*.yaml")))
    return u


def test_calibrate_on_scores_other_tables_with_the_calibrated_chip(files, url):
    mb = str(files["syn_gemm"].parent)
    run = CliRunner().invoke(cli, ["fidelity", "--registry", url, "--calibrate-on", mb, "--table", str(files["held"]),
                                   "--json"])
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout)
    cal = out["calibration"]["TEST-GPU"]["numbers"]
    assert cal["compute_units.fp16.sustained_fraction"]["value"] == 0.7
    assert cal["compute_units.fp16.sustained_fraction"]["previous"] is None
    assert cal["execution.launch_overhead_us"] == dict(cal["execution.launch_overhead_us"], value=12.0, previous=5.0)
    by_file = {}
    for p in out["predictions"]:
        if p["chip"] == "TEST-GPU":
            by_file.setdefault(p["row"]["where"].rsplit("/", 1)[-1].split(":")[0], set()).add(p["in_sample"])
    assert by_file == {"syn_gemm.csv": {True}, "syn_copy.csv": {True}, "syn_launch.csv": {True}, "held.csv": {False}}
    big = next(p for p in out["predictions"] if p["row"]["where"].endswith("syn_gemm.csv:5"))
    assert abs(big["error"]) < 0.02                     # the calibrated chip prices its own best row
    other = next(p for p in out["predictions"] if p["chip"] == "OTHER-GPU")
    assert other["predicted_s"] is None and other["in_sample"]   # not in the registry: unplanned, never scored
    held = [s for s in out["scores"] if s["sample"] == "out-of-sample"]
    assert {s["family"] for s in held} == {"matmul", "softmax", "all"} and all(s["tables"] for s in held)


def test_calibrate_on_text_and_refusals(files, url):
    run = CliRunner().invoke(cli, ["fidelity", "--registry", url, "--calibrate-on", str(files["syn_gemm"]),
                                   "--calibrate-on", str(files["syn_launch"]), "--table", str(files["held"])])
    assert run.exit_code == 0, run.output
    assert "calibrated TEST-GPU on microbenchmarks (in memory; the registry's file is unchanged):" in run.output
    assert "compute_units.fp16.sustained_fraction: unset -> 0.7" in run.output
    assert "execution.launch_overhead_us: 5 -> 12" in run.output
    assert run.output.index("Out of sample") < run.output.index("In sample")
    refused = CliRunner().invoke(cli, ["fidelity", "--registry", url, "--calibrate-on", str(files["syn_gemm"]),
                                       "--table", str(files["held"]), "--record"])
    assert refused.exit_code == 2 and "--calibrate-on scores calibrated copies" in refused.output
    missing = CliRunner().invoke(cli, ["fidelity", "--registry", url, "--calibrate-on", "/no/such.csv"])
    assert missing.exit_code == 2 and "Traceback" not in missing.output
