"""Issue 33's zoo, compiled: every family of ``tools/bench_zoo.py`` (tiny configs, random
weights, nothing downloaded) through ``torch.compile(backend="torchfl")`` on NPU-V3 in float16,
against the same model in CPU float32, within the zoo's float16 tolerance (2e-2 of the largest
output magnitude: fp16's 2^-11 relative rounding compounded over two layers of attention and
MLP; bench_zoo.TOLERANCE), with no node left on the CPU. ``tests/eager/test_zoo_eager.py`` runs
the same families on the eager device: together they are the zoo in both modes.
"""
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

import bench_zoo  # noqa: E402


@pytest.mark.parametrize("name", bench_zoo.DEFAULT)
def test_family_compiled_on_npu_v3(name):
    r = bench_zoo.run_one(name, "NPU-V3", "float16", runs=1)
    assert "error_message" not in r, r
    assert r["within_tolerance"], (r["error"], r["tolerance"])
    assert r["fallbacks"] == 0, r["fallback_reasons"]
    assert r["nodes"] > 0 and r["graphs"] >= 1


@pytest.mark.parametrize("name,chip", [("bert", "NPU-V3"), ("albert", "NPU-V3"), ("wav2vec2", "NPU-V3"),
                                       ("vit", "NPU-V3"), ("llama", "TFL-X1")])
def test_family_gradients_compiled(name, chip):
    """One compiled forward and backward (AOTAutograd's graphs on the chip) against eager
    torch float32's gradients, within the zoo's tolerance of the chip's precision (one scale
    per model: bench_zoo.train_compiled). The families that found the faults: every
    transformer's attention gradients (10-100x off), ALBERT's shared layers and Wav2Vec2's
    (a KernelError planning the backward), LLaMA's tensor constants. LLaMA on TFL-X1
    (bfloat16): on a float16-only chip its RMS norm's backward overflows (rsqrt cubed)."""
    r = bench_zoo.train_compiled(name, chip, bench_zoo.CHIPS[chip])
    assert r["train_ok"], r
