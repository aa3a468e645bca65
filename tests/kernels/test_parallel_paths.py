"""The multi-threaded paths (small problems run serially, so force them here): N-split and
M-split GEMM tiles, parallel attention tasks, parallel softmax rows, conv loops — same results and
same counted bytes as the plan."""
import pytest
import torch
import torch.nn.functional as F

import torchfl.kernels.threads as threads
from torchfl.kernels import DeviceMemory

from .helpers import as_f32, assert_close, chip_for, conv_backward_checked, conv_checked, dev, run_checked


@pytest.fixture(autouse=True)
def always_parallel(monkeypatch):
    monkeypatch.setattr(threads, "SMALL_FLOPS", 0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mkn", [(97, 61, 300), (300, 61, 7), (5, 33, 200), (130, 129, 131)])
@pytest.mark.parametrize("cache", (16 << 10, 8 << 20))
def test_gemm_parallel(dtype, mkn, cache):
    M, K, N = mkn
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    x = dev(torch.randn(M, K), mem, dtype)
    w = dev(torch.randn(N, K), mem, dtype)
    b = dev(torch.randn(N), mem, dtype)
    (y,), _ = run_checked("linear_gelu", chip, {"x": x, "w": w, "bias": b})
    assert_close(as_f32(y), F.gelu(F.linear(as_f32(x), as_f32(w), as_f32(b))), dtype, scale=3)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cache", (32 << 10, 8 << 20))
def test_attention_parallel(causal, cache):
    chip = chip_for("float32", cache)
    mem = DeviceMemory(chip)
    q, k, v = (dev(torch.randn(2, 3, 67, 32), mem) for _ in range(3))
    (o,), _ = run_checked("attention", chip, {"q": q, "k": k, "v": v}, {"causal": causal})
    ref = F.scaled_dot_product_attention(as_f32(q), as_f32(k), as_f32(v), is_causal=causal)
    assert_close(as_f32(o), ref, "float32", scale=2)


@pytest.mark.parametrize("cache", (16 << 10, 8 << 20))
def test_softmax_parallel(cache):
    chip = chip_for("float32", cache)
    mem = DeviceMemory(chip)
    x = dev(torch.randn(301, 77), mem)
    (y,), _ = run_checked("softmax", chip, {"x": x}, {"dim": -1})
    assert_close(as_f32(y), torch.softmax(as_f32(x), -1), "float32")


@pytest.mark.parametrize("shape", [(2, 16, 16, 24, 1, 1), (2, 16, 9, 16, 3, 16), (1, 8, 13, 16, 3, 1)],
                         ids=["1x1", "depthwise", "3x3"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv_parallel(shape, dtype):
    """Small convs run serially (threads.conv_small): here their parallel loops run, with the
    same results and counted bytes."""
    conv_checked(shape, dtype)


def test_conv_backward_parallel():
    conv_backward_checked()
