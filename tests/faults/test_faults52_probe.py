"""Issue 52 cases 9 and 10 (and issue 53 point 10): ``hcd probe``. Before: ``--threads 100000``
ended in a segfault (exit 139, no message); without options the probe timed every thread by the
wall clock (fp32 15.8 then 0.02 GFLOP/s in two runs; 4.76 on a busy host where one thread's CPU
time gives 87.5), and under load wrote numbers its own validator rejected ("peak_tflops must be
>= 1e-06") after 124 s, reported as "a bug"; ``--name`` was checked only after probing. Now every
option is bounded before measuring, the default is one thread timed by its CPU time, a result no
HCD may state is refused (nothing written), and noisy figures are said with their spread."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from torchfl.cli.main import cli
from torchfl.fidelity.microbench import Figure
from torchfl.fidelity.probe import Probe, ProbeError, _check_figures, available_cpus


def test_threads_beyond_the_cpus_are_refused_before_measuring():
    res = subprocess.run([sys.executable, "-m", "torchfl.cli", "hcd", "probe", "--threads", "100000"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: --threads 100000 is more than the {available_cpus()} CPU(s) this process may use; "
                     f"give 1 to {available_cpus()} (1, the default, times one thread's CPU time: steady on a "
                     "shared host)"], res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize("args, words", [
    (["--name", "bad name!"], "--name 'bad name!' is not a valid chip name"),
    (["--threads", "0"], "--threads must be a positive integer"),
    (["--device", "tpu"], "unknown device 'tpu'"),
])
def test_options_are_checked_before_any_measuring(tmp_path, args, words):
    out = tmp_path / "me.hcd"
    r = CliRunner().invoke(cli, ["hcd", "probe", "--quick", "-o", str(out), *args])
    assert r.exit_code == 2, r.output
    assert r.output.strip() == r.output.strip().splitlines()[0] and words in r.output, r.output
    assert "gemm" not in r.output and "a bug" not in r.output     # nothing was measured
    assert not out.exists()


def test_the_default_is_one_thread_timed_by_its_cpu_time(tmp_path):
    out = tmp_path / "host.hcd"
    r = CliRunner().invoke(cli, ["hcd", "probe", "--quick", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "1 thread(s); timer: cpu (thread CPU time)" in out.read_text()
    (spread,) = [ln for ln in r.output.splitlines() if ln.startswith("spread: fp32 ")]
    assert spread.endswith("runs GFLOP/s (every figure's is in the file)") and len(spread) < 100, spread
    assert all(len(ln) <= 100 for ln in r.output.splitlines() if ln.startswith(("warning:", "spread:"))), r.output


def _busy_probe(**figures) -> Probe:
    """A Probe as a very loaded host measured it: the runs are what the clock said."""
    from torchfl.fidelity.machine import os_caches

    res = Probe("cpu", "Test CPU", 1, "wall", True, caches=os_caches(), llc_bytes=8 << 20, vector_bytes=64)
    base = dict(gemm_float32=(2e4, 3e4, 1e5), copy_bw=(1e9, 1.1e9, 1.2e9), read_bw=(1e9,) * 3, write_bw=(1e9,) * 3,
                cache_bw=(5e9, 6e9, 7e9), launch=(1e-6,) * 3, matrix_launch=(3e-6,) * 3)
    base.update(figures)
    res.figures = {k: Figure(k, v, "test", (1.0, "")) for k, v in base.items()}
    return res


def test_numbers_no_hcd_may_state_are_refused_not_written():
    with pytest.raises(ProbeError) as exc:
        _check_figures(_busy_probe())                  # 30 kFLOP/s: below the schema's 1e-6 TFLOPS
    msg = str(exc.value)
    assert "compute_units.fp32.peak_tflops" in msg and "too busy" in msg and "nothing was written" in msg
    assert "\n" not in msg


def test_noisy_figures_are_said_with_their_spread():
    res = _busy_probe(gemm_float32=(2e10, 8e10, 9e10), cache_bw=(0.7e9, 0.8e9, 0.9e9))
    _check_figures(res)
    assert any(w.startswith("gemm_float32 runs spread 4.5x: a noisy host") for w in res.warnings), res.warnings
    assert any(w.startswith("on-chip copy 0.8 < off-chip 1.1 GB/s: contention") for w in res.warnings), res.warnings


def test_a_cache_far_slower_than_memory_is_refused():
    """The busy host's wall-clock probe wrote on-chip 0.15 GB/s beside off-chip 5 GB/s (issue 53)."""
    with pytest.raises(ProbeError, match=r"on-chip copy measured 0.2 GB/s, under half the off-chip 1.1 GB/s"):
        _check_figures(_busy_probe(gemm_float32=(6e10,) * 3, cache_bw=(1e8, 2e8, 3e8)))


def test_several_threads_far_below_one_threads_rate_are_refused():
    """``--threads 2 --timer wall`` on a loaded 2-CPU host measured fp32 0.02 GFLOP/s (one thread
    by its CPU time: 62) and wrote it; now that is refused against one thread measured then."""
    import torch

    from torchfl.fidelity.probe import _check_against_one_thread

    res = _busy_probe(gemm_float32=(2e7,) * 3)
    res.threads = 2
    with pytest.raises(ProbeError, match=r"--threads 2 --timer wall measured fp32 0.02 GFLOP/s, but one thread"):
        _check_against_one_thread(torch, res)
