"""``torchfl hcd probe``: a quick probe of this host writes a valid HCD whose numbers are what
torch measures here (checked against measurements taken in the test itself)."""
from __future__ import annotations

import re
import statistics
import time

import pytest
import torch
from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.fidelity.probe import CacheLevel, ProbeError, _short, os_caches, probe
from torchfl.hcd import check_hcd


@pytest.fixture(scope="module")
def quick():
    """One quick probe on one thread (CPU time: steady on a shared machine)."""
    return probe("cpu", threads=1, quick=True)


def _gflops_now(dtype, n=256, runs=5):
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(n, n).to(dtype)
        torch.mm(a, a)
        ts = []
        for _ in range(runs):
            t = time.thread_time()
            torch.mm(a, a)
            ts.append(time.thread_time() - t)
    finally:
        torch.set_num_threads(old)
    return 2 * n ** 3 / statistics.median(ts)


def test_quick_probe_writes_a_valid_hcd(quick, tmp_path):
    path = tmp_path / "host.hcd"
    text = quick.write(path)
    report = check_hcd(path)
    assert report.ok, [str(d) for d in report.diagnostics]
    h = report.hcd
    assert h.chip.device_type == "host_cpu" and h.chip.name.startswith("HOST-")
    assert "float32" in h.dtypes and h.compute_units.fp32.count == 1
    # every measured number carries its spread in a comment
    assert len(re.findall(r"runs min/median/max [\d.]+/[\d.]+/[\d.]+", text)) >= 6


def test_probe_numbers_are_this_machines(quick):
    h = quick.hcd()
    # the GEMM peak is what torch reaches here: within 2x of a 256^3 GEMM timed now (the probe's
    # size is at least as large, so it is not slower by more than the load's noise)
    now = _gflops_now(torch.float32)
    assert now / 2 < h.peak_ops_per_s("float32") < now * 4
    bw = h.memory.off_chip_memory.bandwidth_gb_per_s
    assert 0.1 < bw < 1000                                   # GB/s: more than nothing, less than 1 TB/s
    assert h.memory.on_chip_cache.bandwidth_gb_per_s > 0
    llc = max(c.size_bytes for c in os_caches() if c.kind != "Instruction")
    assert h.memory.on_chip_cache.size_kb * 1024 == llc       # the last level, as the OS states it
    launch = quick.figures["launch"].value
    assert 1e-8 < launch < 1e-3                              # a tiny op costs microseconds, not ms
    fig = quick.figures["gemm_float32"]
    assert min(fig.runs) <= fig.value <= max(fig.runs) and len(fig.runs) == 3


def test_format_11_fields_when_the_schema_has_them(quick):
    from torchfl.hcd.model import HCD

    if "execution" not in HCD.model_fields:
        pytest.skip("this tree's HCD schema is format 1.0 (no execution section yet)")
    h = quick.hcd()
    assert h.execution.concurrent_tiles is None and h.execution.tile_elements is None   # no grain measured
    assert not [w for w in h.warnings], [str(w) for w in h.warnings]                  # the probe's file is clean
    assert h.execution.launch_overhead_us == pytest.approx(quick.figures["launch"].value * 1e6, rel=1e-3)
    frac = h.memory.off_chip_memory.sustained_fraction
    assert 0 < frac <= 1
    assert h.memory.on_chip_cache.retains_between_kernels is True      # a CPU's last level is a cache


def test_os_caches_reads_sysfs(tmp_path):
    for i, (level, kind, size) in enumerate([(1, "Data", "48K"), (2, "Unified", "2048K"), (3, "Unified", "96M")]):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "level").write_text(f"{level}\n")
        (d / "type").write_text(kind + "\n")
        (d / "size").write_text(size + "\n")
        (d / "shared_cpu_list").write_text("0-15\n")
    caches = os_caches(str(tmp_path))
    assert caches[-1] == CacheLevel(3, "Unified", 96 << 20, "0-15")
    assert [c.size_bytes for c in caches] == [48 << 10, 2 << 20, 96 << 20]


def test_chip_names_are_valid_and_say_the_model():
    assert _short("AMD EPYC 9R14 96-Core Processor") == "AMD-EPYC-9R14"
    assert _short("Intel(R) Xeon(R) Platinum 8488C") == "Intel-Xeon-Platinum-8488C"
    assert _short("NVIDIA H100 80GB HBM3") == "H100-80GB-HBM3"


def test_bad_arguments_are_one_line_errors():
    with pytest.raises(ProbeError, match="unknown device 'tpu'"):
        probe("tpu")
    with pytest.raises(ProbeError, match="use --threads 1 with --timer cpu"):
        probe("cpu", threads=2, timer="cpu")
    with pytest.raises(ProbeError, match="positive integer"):
        probe("cpu", threads=0)


def test_cli_probe_bad_device_and_output(tmp_path):
    r = CliRunner().invoke(cli, ["hcd", "probe", "--device", "tpu"])
    assert r.exit_code == 2
    assert "error: unknown device 'tpu'" in r.output and "Traceback" not in r.output
    if not torch.cuda.is_available():
        r = CliRunner().invoke(cli, ["hcd", "probe", "--device", "cuda"])
        assert r.exit_code == 2 and "torch sees no CUDA device" in r.output


def test_cli_probe_writes_a_file_that_validates(tmp_path):
    out = tmp_path / "me.hcd"
    r = CliRunner().invoke(cli, ["hcd", "probe", "--quick", "--threads", "1", "--name", "HOST-TEST", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "wrote" in r.output and "GFLOP/s" in r.output
    r = CliRunner().invoke(cli, ["hcd", "validate", str(out)])
    assert r.exit_code == 0 and "valid: HOST-TEST 1.0.0" in r.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here (CI has none)")
def test_cuda_probe(tmp_path):
    res = probe("cuda", quick=True)
    h = res.hcd()
    assert h.chip.device_type == "host_cuda"
    assert h.peak_ops_per_s("float16") > 1e12          # any CUDA GPU torch runs does > 1 TFLOPS fp16
    assert 10 < h.memory.off_chip_memory.bandwidth_gb_per_s < 20000
