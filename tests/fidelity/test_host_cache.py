"""HCD 1.1 ``memory.on_chip_cache.retains_between_kernels``: a hardware-managed cache (a CPU's
last level, a GPU's L2) keeps what one kernel wrote for the next, so a kernel whose whole
traffic fits it moves that traffic at the cache's bandwidth. Found on the host: torch's relu,
add and batch norm on ResNet-50 b1 activations (<= 3.2 MB) ran 2-3x faster than the off-chip
copy rate predicts (BENCHMARKS.md, "Host fidelity")."""
from __future__ import annotations

import pytest
from dataclasses import replace

from torchfl.hcd import HCDError, load_hcd_text
from torchfl.kernels.chip import ChipModel
from torchfl.kernels.tiling import simulated_time, stream_plan, time_terms

HCD = """
chip: {{name: CACHE-TEST, vendor: t, version: 1.0.0, device_type: cache_test}}
compute_units:
  fp32: {{count: 1, peak_tflops: 0.1}}
memory:
  on_chip_cache: {{size_kb: 1024, bandwidth_gb_per_s: 100{extra}}}
  off_chip_memory: {{bandwidth_gb_per_s: 20}}
tensor: {{max_rank: 4, supported_dtypes: [torch.float32], default_layout: NCHW}}
constraints: {{max_batch_size: 64, max_sequence_length: 512, memory_alignment_bytes: 64}}
"""


def _chip(extra=""):
    return ChipModel.from_hcd(load_hcd_text(HCD.format(extra=extra)))


def test_the_field_is_format_11_and_a_strict_boolean():
    h = load_hcd_text(HCD.format(extra=", retains_between_kernels: true"))
    assert h.format_version == "1.1" and h.memory.on_chip_cache.retains_between_kernels is True
    assert load_hcd_text(HCD.format(extra="")).format_version == "1.0"
    with pytest.raises(HCDError, match="retains_between_kernels"):
        load_hcd_text(HCD.format(extra=", retains_between_kernels: 'yes'"))


def _relu(n, chip):
    return stream_plan("relu", (n,), n, 4, 4, 1, chip, unit_name="elements")


def test_a_kernel_that_fits_moves_at_the_cache_bandwidth():
    warm, cold = _chip(", retains_between_kernels: true"), _chip()
    small = _relu(64 * 1024, warm)                 # 512 KiB of traffic: fits the 1 MiB cache
    assert small.traffic.bytes <= warm.cache_bytes
    compute = small.traffic.flops / 0.1e12        # a resident tile: load, compute, store (c + m)
    assert simulated_time(small, warm, "float32") == pytest.approx(small.traffic.bytes / 100e9 + compute, rel=1e-3)
    assert simulated_time(small, cold, "float32") == pytest.approx(small.traffic.bytes / 20e9 + compute, rel=1e-3)
    t = time_terms(small, warm, "float32")
    assert t.bound == "on-chip cache" and any("on-chip cache" in n for n in t.notes())
    big = _relu(1 << 20, warm)                     # 8 MiB of traffic: streamed from off-chip memory
    assert big.traffic.bytes > warm.cache_bytes
    assert simulated_time(big, warm, "float32") == pytest.approx(simulated_time(big, cold, "float32"))
    assert time_terms(big, warm, "float32").bound == "off-chip"


def test_false_or_absent_predicts_exactly_as_before():
    off = _chip(", retains_between_kernels: false")
    cold = _chip()
    plan = _relu(64 * 1024, cold)
    assert simulated_time(plan, off, "float32") == simulated_time(plan, cold, "float32")
    assert simulated_time(plan, replace(cold, cache_retains=False), "float32") == simulated_time(plan, cold, "float32")


def test_the_planner_prices_a_warm_relu_at_the_cache_rate():
    import torch

    from torchfl.planner.api import plan_module

    x = torch.randn(1, 16, 32, 32)                 # 64 KiB in, 64 KiB out
    times = {}
    for extra in ("", ", retains_between_kernels: true"):
        plan = plan_module(torch.nn.ReLU(), (x,), load_hcd_text(HCD.format(extra=extra)))
        (step,) = [s for s in plan.steps if s.kernel == "relu"]
        times[extra] = step.predicted_time_s
    # memory-bound at both rates: the cache's 100 GB/s against off-chip 20 GB/s (plus the same compute)
    assert 3.5 < times[""] / times[", retains_between_kernels: true"] <= 5.0
