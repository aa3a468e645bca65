"""The matmul family reading a transposed operand in place (``trans_a`` / ``trans_b``): the
kernel is given the tensor *before* the transpose (q @ k^T's K as stored, training's
mm(x^T, g)'s x) and walks it through its strides, as cuBLAS's op(B) = T does. Checked against
torch on the same inputs with the tolerances of tests/kernels/test_matmul.py (TOL per dtype,
scaled as there), counted bytes == predicted, and the tiling prices exactly what the GEMM of
an already-transposed copy would move (the copy is what goes away, not bytes of the GEMM)."""
import math

import pytest
import torch

from torchfl.kernels import DeviceMemory
from torchfl.kernels.catalog import CATALOG
from torchfl.kernels.errors import KernelError

from .helpers import CACHES, as_f32, assert_close, chip_for, dev, run_checked

FLOAT_DT = ["float32", "float16", "bfloat16", "bfloat16_emulated"]


def _ref(t):
    return as_f32(t).to(torch.float64)


@pytest.mark.parametrize("dtype", FLOAT_DT)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (4, 17, 9, 13), (2, 1, 64, 40), (1, 33, 40, 7),
                                   (0, 3, 4, 5), (3, 5, 0, 2), (2, 0, 3, 4)])
@pytest.mark.parametrize("trans", ["b", "a", "ab"])
@pytest.mark.parametrize("cache", (16 << 10, 8 << 20))
def test_bmm_transposed(dtype, shape, trans, cache):
    Bt, M, K, N = shape
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(Bt + 3 * M + 5 * K + 7 * N)
    a_log, b_log = torch.randn(Bt, M, K, generator=g), torch.randn(Bt, K, N, generator=g)
    # what the kernel is given: the stored tensors before the transposes
    a = dev(a_log.transpose(1, 2).contiguous() if "a" in trans else a_log, mem, dtype)
    b = dev(b_log.transpose(1, 2).contiguous() if "b" in trans else b_log, mem, dtype)
    attrs = {"trans_a": "a" in trans, "trans_b": "b" in trans}
    (c,), _ = run_checked("bmm", chip, {"a": a, "b": b}, attrs)
    at, bt = _ref(a), _ref(b)
    want = torch.bmm(at.transpose(1, 2) if "a" in trans else at, bt.transpose(1, 2) if "b" in trans else bt)
    assert c.shape == (Bt, M, N)
    assert_close(as_f32(c), want.float(), dtype, scale=max(2.0, math.sqrt(K) / 4), what=f"bmm^{trans} {shape}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("cache", CACHES)
def test_bmm_transposed_b_with_heads_merged(dtype, cache):
    """HF attention's q @ k.transpose(2, 3): K stored [B, H, L, D], the bmm's batch is B*H
    (the view between the transpose and the GEMM merges the leading axes); a decode query
    (M = 1: the GEMV path) and a prefill one."""
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    for m in (1, 9):
        g = torch.Generator().manual_seed(m)
        k = torch.randn(2, 3, 21, 16, generator=g)
        q = torch.randn(6, m, 16, generator=g)
        kd, qd = dev(k, mem, dtype), dev(q, mem, dtype)
        (s,), _ = run_checked("bmm", chip, {"a": qd, "b": kd}, {"trans_b": True})
        want = _ref(qd) @ _ref(kd).reshape(6, 21, 16).transpose(1, 2)
        assert_close(as_f32(s), want.float(), dtype, scale=2, what=f"q@k^T M={m}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", [None, "NLC", "CLN", "LNC"])
def test_bmm_transposed_reads_any_stored_layout(dtype, layout):
    """A non-contiguous stored operand (another physical axis order): read through its strides."""
    chip = chip_for(dtype, 64 << 10)
    mem = DeviceMemory(chip)
    a = dev(torch.randn(3, 19, 11), mem, dtype, layout=layout)     # stored [B, K, M]
    b = dev(torch.randn(3, 23, 19), mem, dtype, layout=layout)     # stored [B, N, K]
    (c,), _ = run_checked("bmm", chip, {"a": a, "b": b}, {"trans_a": True, "trans_b": True})
    want = _ref(a).transpose(1, 2) @ _ref(b).transpose(1, 2)
    assert_close(as_f32(c), want.float(), dtype, scale=2)


@pytest.mark.parametrize("dtype", FLOAT_DT)
@pytest.mark.parametrize("mkn", [(1, 1, 1), (7, 13, 5), (37, 53, 29), (64, 300, 17), (0, 5, 3), (5, 0, 3), (3, 4, 0)])
@pytest.mark.parametrize("trans", ["a", "b", "ab"])
def test_matmul_transposed(dtype, mkn, trans):
    """mm / addmm with a transposed operand: training's weight gradient mm(x^T, g), an addmm of
    a transposed weight; alpha, beta and the bias as addmm's."""
    M, K, N = mkn
    chip = chip_for(dtype, 16 << 10)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(M * 7 + K * 3 + N)
    a_log, b_log = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    a = dev(a_log.t().contiguous() if "a" in trans else a_log, mem, dtype)
    b = dev(b_log.t().contiguous() if "b" in trans else b_log, mem, dtype)
    bias = dev(torch.randn(N, generator=g), mem, dtype)
    attrs = {"alpha": 0.5, "beta": 2.0, "trans_a": "a" in trans, "trans_b": "b" in trans}
    (c,), _ = run_checked("matmul", chip, {"a": a, "b": b, "bias": bias}, attrs)
    at, bt = _ref(a), _ref(b)
    want = 0.5 * ((at.t() if "a" in trans else at) @ (bt.t() if "b" in trans else bt)) + 2.0 * _ref(bias)
    assert c.shape == (M, N)
    assert_close(as_f32(c), want.float(), dtype, scale=max(1.0, math.sqrt(K) / 4), what=f"mm^{trans} {mkn}")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_nan_and_inf_propagate_as_torch(dtype):
    chip = chip_for(dtype, 16 << 10)
    mem = DeviceMemory(chip)
    k = torch.randn(2, 12, 8)
    k[0, 3, 5] = float("nan")
    k[1, 7, 2] = float("inf")
    q = torch.randn(2, 4, 8)
    qd, kd = dev(q, mem, dtype), dev(k, mem, dtype)
    (s,), _ = run_checked("bmm", chip, {"a": qd, "b": kd}, {"trans_b": True})
    want = torch.bmm(as_f32(qd), as_f32(kd).transpose(1, 2))
    got = as_f32(s)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    fin = want.isfinite()
    assert_close(got[fin], want[fin], dtype, scale=2)


@pytest.mark.parametrize("kernel,shapes,attrs,plain", [
    ("bmm", {"a": (512, 1, 128), "b": (16, 32, 2112, 128)}, {"trans_b": True},
     {"a": (512, 1, 128), "b": (512, 128, 2112)}),
    ("bmm", {"a": (8, 64, 300), "b": (8, 64, 96)}, {"trans_a": True}, {"a": (8, 300, 64), "b": (8, 64, 96)}),
    ("matmul", {"a": (4096, 768), "b": (4096, 3072)}, {"trans_a": True}, {"a": (768, 4096), "b": (4096, 3072)}),
    ("matmul", {"a": (128, 768), "b": (3072, 768)}, {"trans_b": True}, {"a": (128, 768), "b": (768, 3072)}),
])
@pytest.mark.parametrize("cache", (48 << 10, 40 << 20))
def test_one_tiling_prices_a_transposed_operand_as_the_copy_it_replaces(kernel, shapes, attrs, plain, cache):
    """plan_gemm is the one tiling function: the transposed problem gets the tiles, bytes and
    FLOPs of the GEMM that read a transposed copy (a transposed operand moves the same bytes per
    tile); only the copy before it is gone."""
    spec = CATALOG[kernel]
    chip = chip_for("float16", cache)
    dts = {k: "float16" for k in shapes}
    t = spec.tile(spec.problem(shapes, attrs, "float16", None, dts), chip)
    u = spec.tile(spec.problem(plain, None, "float16", None, dts), chip)
    assert t.traffic == u.traffic and t.config.tiles == u.config.tiles and t.config.grid == u.config.grid


@pytest.mark.parametrize("kernel,shapes,attrs,what", [
    ("bmm", {"a": (4, 3, 5), "b": (4, 6, 7)}, {"trans_b": True}, "trans_b: b given as [...,N,K]"),
    ("bmm", {"a": (4, 3, 5), "b": (2, 3, 7, 5)}, {"trans_b": True}, "got a[4, 3, 5] b[2, 3, 7, 5]"),
    ("bmm", {"a": (2, 2, 5, 3), "b": (4, 5, 7)}, {}, "bmm: expects a[B,M,K] and b[B,K,N]"),
    ("matmul", {"a": (2, 5, 3), "b": (5, 7)}, {"trans_a": True}, "a transposed a is 2-D"),
    ("matmul", {"a": (3, 5), "b": (5, 7)}, {"trans_b": True}, "trans_b: b given as [...,N,K]"),
])
def test_shapes_that_do_not_fit_say_which_operand_is_transposed(kernel, shapes, attrs, what):
    spec = CATALOG[kernel]
    with pytest.raises(KernelError) as e:
        spec.problem(shapes, attrs, "float32", None, {k: "float32" for k in shapes})
    assert what in str(e.value), str(e.value)
