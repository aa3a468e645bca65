"""Issue 48's mixture-of-experts families (tiny configs from transformers: 4 experts, 2 per
token, random weights, nothing downloaded) in both modes on NPU-V3 float16, against eager torch
float32 within the zoo's float16 tolerance (tools/bench_zoo.TOLERANCE, 2e-2 of the largest
output magnitude).

Before: on ``npu`` each crashed (``NotImplementedError: "histogram_cpu" not implemented for
'Int'``: transformers passes int32 expert ids to histc on any device but CPU); compiled, 16 ops
fell back each (topk, sort, histc, cumsum, index_put, div.Tensor_mode, transformers'
grouped-GEMM). Compiled, none is left: transformers' ``grouped_mm_fallback`` (the experts'
GEMMs in float16/float32; 4 host steps each before core 1.23.0) runs as the grouped_mm kernel.
On ``npu``, histc of int32 ids ran on the host (2 per forward: torch's meta kernel refuses integers
on CPU tensors) until the eager device traced it over meta-device examples (runtime/eager/trace
TRACE_ON_META): now 0 host steps in both modes. topk, sort, histc, the offsets' cumsum and the rounding divisions run on
the chip (core 1.14.0-1.19.0), the tokens' inverse permutation (index_put) too (core 1.20.0).

In bfloat16 (the published dtype of Mixtral and OLMoE) transformers calls ``torch._grouped_mm``
for the experts, compiled or not: compiled, core 1.21.0 decomposes it into the grouped_mm kernel
and the three families compile whole (0 fallbacks) on TFL-X1; on ``npu`` torch's per-group loop
runs one mm per expert on the chip. In float16/float32 the compiled graph holds the opaque
``transformers.grouped_mm_fallback`` instead, which core 1.23.0 decomposes into the same kernel."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import bench_zoo  # noqa: E402

FAMILIES = {name: bench_zoo.MOE[name] for name in ("mixtral", "qwen2_moe", "olmoe")}   # tools/bench_zoo.MOE
COMPILED_HOST: dict = {}          # compiled: every op on the chip
EAGER_HOST: dict = {}             # eager: every op on the chip too (histc of int32 ids since helper zoo2)


@pytest.fixture
def families(monkeypatch):
    for name, entry in FAMILIES.items():
        monkeypatch.setitem(bench_zoo.MODELS, name, entry)


def _within(counts, allowed):
    return all(n <= allowed.get(op, 0) for op, n in counts.items())


@pytest.mark.parametrize("name", list(FAMILIES))
def test_moe_compiled_on_npu_v3(families, name):
    r = bench_zoo.run_one(name, "NPU-V3", "float16", runs=1)
    assert "error_message" not in r, r
    assert r["within_tolerance"], (r["error"], r["tolerance"])
    assert _within(r["fallback_ops"], COMPILED_HOST), r["fallback_reasons"]
    assert r["fallbacks"] == 0, r["fallback_reasons"]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_moe_on_the_eager_device(families, fp16_dev, name, monkeypatch):
    import torch

    monkeypatch.setenv("TORCHFL_PRECISION", "float16")
    index = [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())].index("NPU-V3")
    r = bench_zoo.run_one_eager(name, "NPU-V3", index, "float16", runs=0)
    assert "error_message" not in r, r
    assert r["within_tolerance"], (r["error"], r["tolerance"])
    assert _within(r["fallback_ops"], EAGER_HOST), r["fallback_ops"]


@pytest.mark.parametrize("name", list(FAMILIES))
def test_moe_bfloat16_compiled_whole_on_tfl_x1(name, monkeypatch):
    from torchfl.kernels.grouped.torchop import register

    register()      # a session that loaded the kernel catalog before torch (see torchop)
    r = bench_zoo.run_one(f"{name}_bf16", "TFL-X1", "bfloat16", runs=1)
    assert "error_message" not in r, r
    assert r["within_tolerance"], (r["error"], r["tolerance"])
    assert r["fallbacks"] == 0, r["fallback_reasons"]


def test_moe_bfloat16_on_the_eager_device(fp16_dev, monkeypatch):
    """On ``npu`` in bfloat16, aten::_grouped_mm reaches the device through torch's own per-group
    loop: one mm per expert with tokens, each on the chip (no host fallback)."""
    import torch

    index = [torch.npu.get_device_name(i) for i in range(torch.npu.device_count())].index("TFL-X1")
    r = bench_zoo.run_one_eager("mixtral_bf16", "TFL-X1", index, "bfloat16", runs=0)
    assert "error_message" not in r, r
    assert r["within_tolerance"], (r["error"], r["tolerance"])
    assert _within(r["fallback_ops"], EAGER_HOST), r["fallback_ops"]
