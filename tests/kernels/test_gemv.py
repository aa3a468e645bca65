"""The few-row GEMM path (kernels/gemv.py) for 3..8 rows of A and a float16 / bfloat16 weight: register
blocks of RB rows x CB columns (kernels/gemv_block.py), bf16 as vdpbf16ps dot products where the CPU
has them, else widened. Against torch in float32 within the dtype's tolerance (tests/kernels/tolerances),
counted == predicted (run_checked), and the one rule (``uses_gemv``) the kernel choice and the
frozen weight's packing both read."""
import math

import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import DeviceMemory, gemv
from torchfl.kernels.gemv import CB, RB, gemv_rows, uses_gemv

from .helpers import as_f32, assert_close, chip_for, dev, run_checked

DT16 = ["float16", "bfloat16"]


def test_rule_rows_by_storage():
    """16-bit weights take up to 8 rows (4 with columns of at most 4 KiB), float32 and emulated bf16
    (code 3) two; a B whose columns are not contiguous along K, or a layer-normalised A, take the tiled path."""
    assert gemv_rows(1, 4096) == gemv_rows(2, 2049) == 8
    assert gemv_rows(1, 2048) == gemv_rows(2, 512) == 4
    assert gemv_rows(0, 4096) == gemv_rows(3, 4096) == gemv_rows(0, 512) == 2
    assert uses_gemv(8, 4096, 2, 1) and uses_gemv(3, 301, 1, 1) and not uses_gemv(9, 4096, 1, 1)
    assert uses_gemv(4, 512, 1, 1) and not uses_gemv(5, 512, 1, 1)
    assert uses_gemv(2, 64, 0, 1) and not uses_gemv(3, 64, 0, 1) and not uses_gemv(3, 4096, 3, 1)
    assert not uses_gemv(4, 64, 1, 7) and not uses_gemv(4, 64, 1, 1, has_ln=True)


def _linear(dtype, m, K, N, kernel="linear", freeze=False, x_layout=None, seed=0, x=None, w=None):
    from torchfl.kernels import frozen

    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(seed)
    xt = torch.randn(m, K, generator=g) if x is None else x
    wt = torch.randn(N, K, generator=g) / math.sqrt(K) if w is None else w
    xd = dev(xt, mem, dtype, layout=x_layout)
    wd = dev(wt, mem, dtype)
    bias = dev(torch.randn(N, generator=g), mem, dtype)
    if freeze:
        frozen.freeze(wd.buffer)
    before = frozen.cached_bytes()
    (c,), _ = run_checked(kernel, chip, {"x": xd, "w": wd, "bias": bias})
    kept = frozen.cached_bytes() - before
    ref = F.linear(as_f32(xd), as_f32(wd), as_f32(bias))
    ref = ref if kernel == "linear" else F.gelu(ref)
    wd.buffer.free()
    return c, ref, kept


@pytest.mark.parametrize("dtype", DT16)
@pytest.mark.parametrize("m", [3, 4, 5, 6, 7, 8])
@pytest.mark.parametrize("kernel", ["linear", "linear_gelu"])
def test_rows_3_to_8(dtype, m, kernel):
    """Every row count of the blocked path: K = 2061 (columns over 4 KiB, so 5..8 rows stay here; not a
    whole number of 16- or 32-k steps: the tail), N = 6*6 + 5 (groups of CB columns and a remainder), rows
    padded to RB-row blocks; a kept weight stays as stored (no float32 panels)."""
    assert (CB, RB) == (6, 4) and uses_gemv(m, 2061, 1, 1)
    c, ref, kept = _linear(dtype, m, 2061, 41, kernel, freeze=True, seed=m)
    assert kept == 0
    assert_close(as_f32(c), ref, dtype, scale=max(2.0, math.sqrt(2061) / 4), what=f"{kernel} {m}x2061x41")


@pytest.mark.parametrize("dtype", DT16)
@pytest.mark.parametrize("K,N", [(7, 3), (64, 6), (32, 13), (2304, 2000)])
def test_shapes(dtype, K, N):
    """K under one vector step (all tail), K a whole number of steps (no tail), N under one column group
    (four rows: short columns), and eight rows large enough for every thread (2 * 8 * 2304 * 2000 flops:
    above threads.SMALL_FLOPS)."""
    m = 8 if K == 2304 else 4
    assert uses_gemv(m, K, 1, 1)
    c, ref, _ = _linear(dtype, m, K, N)
    assert_close(as_f32(c), ref, dtype, scale=max(2.0, math.sqrt(K) / 4), what=f"{K}x{N}")


@pytest.mark.parametrize("dtype", DT16)
def test_strided_x(dtype):
    """x stored column-major (its K stride is M, not 1): the rows are gathered, the result the same."""
    c, ref, _ = _linear(dtype, 4, 77, 20, x_layout="BA")
    assert_close(as_f32(c), ref, dtype, scale=2, what="x column-major")


@pytest.mark.parametrize("dtype", DT16)
def test_nan_inf(dtype):
    """NaN and inf in x and w propagate as torch's: a NaN row gives NaN, inf times a positive sum inf."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 40, generator=g)
    w = torch.rand(9, 40, generator=g) + 0.5       # positive weights: inf * w stays +inf
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3, 7] = -float("inf")
    w[4, 39] = float("nan")       # in the tail of the k loop (40 = 32 + 8)
    c, ref, _ = _linear(dtype, 4, 40, 9, x=x, w=w)
    got = as_f32(c)
    assert got[1].isnan().all() and got[:, 4].isnan().all()
    assert (got[2, :4] == float("inf")).all() and (got[3, :4] == -float("inf")).all()
    assert_close(got, ref, dtype, scale=2, what="nan/inf")


def test_bf16_widened_without_dot_product(monkeypatch):
    """A CPU without AVX512-BF16 widens bf16 by a shift (float32 A rows): the same results within
    tolerance (the flag is read at each call, so both paths run here)."""
    monkeypatch.setattr(gemv, "BF16_DOT", False)
    c, ref, _ = _linear("bfloat16", 7, 2061, 41, seed=11)
    assert_close(as_f32(c), ref, "bfloat16", scale=12, what="bf16 widened")


@pytest.mark.parametrize("dtype", DT16)
def test_batched_decode_rows(dtype):
    """x[5, 1, K] (a decode step of five sequences, columns over 4 KiB): M = 5 rows, one weight."""
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(5)
    x = dev(torch.randn(5, 1, 2100, generator=g), mem, dtype)
    w = dev(torch.randn(30, 2100, generator=g) * 0.02, mem, dtype)
    (c,), _ = run_checked("linear", chip, {"x": x, "w": w})
    assert tuple(c.shape) == (5, 1, 30)
    assert_close(as_f32(c), F.linear(as_f32(x), as_f32(w)), dtype, scale=2)


@pytest.mark.parametrize("dtype", ["float32"] + DT16)
@pytest.mark.parametrize("m", [1, 2])
@pytest.mark.parametrize("K", [300, 2500])
def test_one_two_rows_short_and_long_columns(dtype, m, K):
    """One and two rows: columns of at most gemv.SHORT_COLUMN bytes are read one at a time, longer ones
    eight side by side (N = 8*4 + 7: groups and a remainder); both against torch."""
    assert (K * 2 <= gemv.SHORT_COLUMN) == (K == 300) and 2500 * 2 > gemv.SHORT_COLUMN
    c, ref, _ = _linear(dtype, m, K, 39, seed=K + m)
    assert_close(as_f32(c), ref, dtype, scale=max(2.0, math.sqrt(K) / 4), what=f"{m}x{K}x39")


@pytest.mark.parametrize("dtype", DT16)
def test_matmul_column_major_b_alpha_beta(dtype):
    """``a @ b`` with b[K, N] stored column-major (its columns contiguous along K, as a weight's) takes the
    blocked path too; alpha and beta scale the product and the bias in the epilogue."""
    M, K, N = 6, 2061, 29
    assert uses_gemv(M, K, 1, 1)
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(9)
    a = dev(torch.randn(M, K, generator=g), mem, dtype)
    b = dev(torch.randn(K, N, generator=g) / math.sqrt(K), mem, dtype, layout="BA")
    bias = dev(torch.randn(N, generator=g), mem, dtype)
    (c,), _ = run_checked("matmul", chip, {"a": a, "b": b, "bias": bias}, {"alpha": 0.5, "beta": 2.0})
    ref = 0.5 * (as_f32(a).double() @ as_f32(b).double()) + 2.0 * as_f32(bias).double()
    assert_close(as_f32(c), ref.float(), dtype, scale=2, what="matmul b column-major")
