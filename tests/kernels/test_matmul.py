"""Matmul family vs torch: every kernel, dtype, layout; counted == predicted bytes."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory
from torchfl.kernels.catalog import CATALOG
from torchfl.kernels.gemv import uses_gemv
from torchfl.kernels.ukernel import NR

from .helpers import CACHES, as_f32, assert_close, bytes_monotone, chip_for, dev, run_checked

FLOAT_DT = ["float32", "float16", "bfloat16", "bfloat16_emulated"]
SHAPES = [(1, 1, 1), (7, 13, 5), (37, 53, 29), (64, 300, 17), (0, 5, 3), (5, 0, 3), (3, 4, 0), (97, 2, 61)]


def _ref_in(t):
    return as_f32(t).to(torch.float64)


@pytest.mark.parametrize("dtype", FLOAT_DT)
@pytest.mark.parametrize("mkn", SHAPES)
@pytest.mark.parametrize("cache", CACHES)
def test_matmul(dtype, mkn, cache):
    M, K, N = mkn
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(M * 7 + K * 3 + N)
    a = dev(torch.randn(M, K, generator=g), mem, dtype)
    b = dev(torch.randn(K, N, generator=g), mem, dtype, layout="BA" if K % 2 else None)
    bias = dev(torch.randn(N, generator=g), mem, dtype)
    (c,), plan = run_checked("matmul", chip, {"a": a, "b": b, "bias": bias}, {"alpha": 0.5, "beta": 2.0})
    ref = 0.5 * (_ref_in(a) @ _ref_in(b)) + 2.0 * _ref_in(bias)
    assert_close(as_f32(c), ref.float(), dtype, scale=max(1.0, math.sqrt(K) / 4), what=f"matmul {mkn}")


@pytest.mark.parametrize("dtype", FLOAT_DT)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("mkn,cache", [((37, 53, 40), 16 << 10), ((128, 64, 150), 8 << 20), ((3, 33, 19), 16 << 10)])
def test_matmul_gelu(dtype, approximate, mkn, cache):
    """gelu(alpha * a @ b + beta * bias) in the GEMM epilogue (GPT-2's Conv1D then gelu_new): an
    un-transposed b, also stored column-major (a non-contiguous walk), a NaN row as torch."""
    M, K, N = mkn
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(M + K + N)
    x = torch.randn(M, K, generator=g)
    x[0, 0] = float("nan")
    a = dev(x, mem, dtype)
    b = dev(torch.randn(K, N, generator=g) / math.sqrt(K), mem, dtype, layout="BA" if K % 2 else None)
    bias = dev(torch.randn(N, generator=g), mem, dtype)
    (c,), _ = run_checked("matmul_gelu", chip, {"a": a, "b": b, "bias": bias},
                          {"alpha": 0.5, "beta": 2.0, "approximate": approximate})
    ref = F.gelu((0.5 * (_ref_in(a) @ _ref_in(b)) + 2.0 * _ref_in(bias)).float(), approximate=approximate)
    got = as_f32(c)
    assert torch.equal(got.isnan(), ref.isnan())
    fin = ~ref.isnan()
    assert_close(got[fin], ref[fin], dtype, scale=2, what=f"matmul_gelu {mkn}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("layout", [None, "NLC", "CLN", "LNC"])
def test_matmul_batched_a_any_layout(dtype, layout):
    chip = chip_for(dtype, 64 << 10)
    mem = DeviceMemory(chip)
    x = torch.randn(3, 11, 19)
    a = dev(x, mem, dtype, layout=layout)
    b = dev(torch.randn(19, 23), mem, dtype)
    (c,), _ = run_checked("matmul", chip, {"a": a, "b": b})
    assert c.shape == (3, 11, 23)
    assert_close(as_f32(c), (as_f32(a) @ as_f32(b)), dtype, scale=2)


@pytest.mark.parametrize("dtype", FLOAT_DT)
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (4, 17, 9, 13), (2, 64, 40, 33), (0, 3, 4, 5), (3, 5, 0, 2)])
@pytest.mark.parametrize("cache", (16 << 10, 8 << 20))
def test_bmm(dtype, shape, cache):
    Bt, M, K, N = shape
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    a = dev(torch.randn(Bt, M, K), mem, dtype, layout="NLC" if M % 2 else None)
    b = dev(torch.randn(Bt, K, N), mem, dtype)
    (c,), _ = run_checked("bmm", chip, {"a": a, "b": b})
    assert_close(as_f32(c), torch.bmm(as_f32(a), as_f32(b)), dtype, scale=2, what=f"bmm {shape}")


LIN = [("linear", {}, lambda y: y), ("linear_relu", {}, F.relu),
       ("linear_gelu", {"approximate": "none"}, lambda y: F.gelu(y)),
       ("linear_gelu", {"approximate": "tanh"}, lambda y: F.gelu(y, approximate="tanh"))]


@pytest.mark.parametrize("dtype", FLOAT_DT)
@pytest.mark.parametrize("kernel,attrs,act", LIN)
@pytest.mark.parametrize("xshape,N", [((5, 7), 3), ((2, 13, 31), 41), ((1, 1), 1), ((0, 8), 4)])
@pytest.mark.parametrize("cache", (16 << 10, 8 << 20))
def test_linear_family(dtype, kernel, attrs, act, xshape, N, cache):
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    K = xshape[-1]
    x = dev(torch.randn(*xshape), mem, dtype)
    w = dev(torch.randn(N, K), mem, dtype)
    bias = dev(torch.randn(N), mem, dtype)
    (y,), _ = run_checked(kernel, chip, {"x": x, "w": w, "bias": bias}, attrs)
    ref = act(F.linear(as_f32(x), as_f32(w), as_f32(bias)))
    assert_close(as_f32(y), ref, dtype, scale=2, what=kernel)


@pytest.mark.parametrize("dtype", FLOAT_DT)
@pytest.mark.parametrize("xshape,N", [((5, 7), 3), ((2, 13, 64), 41), ((1, 300), 9)])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("cache", (16 << 10, 8 << 20))
def test_layernorm_linear(dtype, xshape, N, affine, cache):
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    K = xshape[-1]
    x = dev(torch.randn(*xshape) * 3 + 1, mem, dtype)
    w = dev(torch.randn(N, K), mem, dtype)
    ins = {"x": x, "w": w, "bias": dev(torch.randn(N), mem, dtype)}
    if affine:
        ins["ln_weight"] = dev(torch.rand(K) + 0.5, mem, dtype)
        ins["ln_bias"] = dev(torch.randn(K), mem, dtype)
    (y,), _ = run_checked("layernorm_linear", chip, ins, {"eps": 1e-5})
    xn = F.layer_norm(as_f32(x), (K,), as_f32(ins["ln_weight"]) if affine else None,
                      as_f32(ins["ln_bias"]) if affine else None, 1e-5)
    ref = F.linear(xn, as_f32(w), as_f32(ins["bias"]))
    assert_close(as_f32(y), ref, dtype, scale=3, what="layernorm_linear")


@pytest.mark.parametrize("mkn", [(1, 1, 1), (7, 13, 5), (33, 70, 19), (0, 3, 3)])
@pytest.mark.parametrize("requant", [False, True])
def test_int8_matmul_exact(mkn, requant):
    M, K, N = mkn
    chip = ChipModel(cache_bytes=4 << 10)
    mem = DeviceMemory(chip)
    rng = np.random.default_rng(M + K)
    an = rng.integers(-128, 128, (M, K), dtype=np.int8)
    bn = rng.integers(-128, 128, (K, N), dtype=np.int8)
    bias = rng.standard_normal(N).astype(np.float32)
    a, b = dev(torch.from_numpy(an), mem), dev(torch.from_numpy(bn), mem, layout="BA")
    attrs = {"a_scale": 0.02, "a_zero": 3, "b_scale": 0.01, "b_zero": -2}
    if requant:
        attrs.update(out_scale=0.05, out_zero=1)
    (c,), _ = run_checked("matmul", chip, {"a": a, "b": b, "bias": dev(torch.from_numpy(bias), mem)}, attrs)
    accum = (an.astype(np.int64) - 3) @ (bn.astype(np.int64) + 2)
    ref = (accum.astype(np.float32) * np.float32(0.02 * 0.01) + bias).astype(np.float32)
    if requant:
        q = np.clip(np.rint(ref / np.float32(0.05)) + 1, -128, 127)
        assert c.dtype == "int8"
        assert np.abs(c.to_numpy().astype(np.int32) - q).max(initial=0) <= 1
    else:
        assert c.dtype == "float32"
        np.testing.assert_allclose(c.to_numpy(), ref, rtol=1e-5, atol=1e-5)


def test_int8_linear_relu():
    chip = ChipModel(cache_bytes=8 << 20)
    mem = DeviceMemory(chip)
    x = torch.randint(-128, 128, (4, 9, 16), dtype=torch.int8)
    w = torch.randint(-128, 128, (5, 16), dtype=torch.int8)
    (y,), _ = run_checked("linear_relu", chip, {"x": dev(x, mem), "w": dev(w, mem)}, {"a_scale": 0.1, "b_scale": 0.1})
    ref = F.relu((x.long() @ w.long().T).float() * 0.01)
    torch.testing.assert_close(as_f32(y), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,shapes", [
    ("matmul", {"a": (200, 300), "b": (300, 100), "bias": (100,)}),
    ("matmul", {"a": (32, 64, 48), "b": (48, 96)}),
    ("bmm", {"a": (4, 100, 64), "b": (4, 64, 80)}),
    ("linear_gelu", {"x": (8, 50, 128), "w": (256, 128), "bias": (256,)}),
    ("layernorm_linear", {"x": (500, 96), "ln_weight": (96,), "ln_bias": (96,), "w": (64, 96)}),
])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int8"])
def test_bigger_cache_never_more_bytes(name, shapes, dtype):
    if name == "layernorm_linear" and dtype == "int8":
        pytest.skip("layernorm_linear has no int8 form")
    dts = {k: ("float32" if dtype == "int8" and k in ("bias",) else dtype) for k in shapes}
    bytes_monotone(name, shapes, None, dtype, dtypes=dts)


def test_seed_example_resident_vs_streamed():
    """The planner's example: on NPU-V3 (8 MiB) a 1x1024x768 @ 768x1024 fp16 matmul keeps
    its operands resident; 32x1024x768 does not fit and streams double-buffered tiles."""
    from pathlib import Path

    from torchfl.hcd import load_hcd

    hcd = load_hcd(Path(__file__).resolve().parents[2] / "hcd_registry" / "npu_v3.hcd")
    chip = ChipModel.from_hcd(hcd)
    spec = CATALOG["matmul"]
    small = spec.tile(spec.problem({"a": (1, 1024, 768), "b": (768, 1024)}, dtype="float16"), chip)
    big = spec.tile(spec.problem({"a": (32, 1024, 768), "b": (768, 1024)}, dtype="float16"), chip)
    assert small.config.strategy == "resident" and small.n_tiles == 1
    assert big.config.strategy == "streamed" and big.config.double_buffered and big.n_tiles > 1
    # both move each operand once here, at their sizes
    assert small.traffic.bytes_read == 2 * 1024 * 768 * 2


def test_bad_shapes_are_clear():
    from torchfl.kernels import KernelError

    spec = CATALOG["matmul"]
    with pytest.raises(KernelError, match=r"a\[...,M,K\] and b\[K,N\]"):
        spec.problem({"a": (3, 4), "b": (5, 6)})
    with pytest.raises(KernelError, match="does not compute in int32"):
        spec.problem({"a": (3, 4), "b": (4, 6)}, dtype="int32")
    with pytest.raises(KernelError, match="unknown attribute"):
        spec.problem({"a": (3, 4), "b": (4, 6)}, {"gamma": 1})


def test_resident_b_needs_the_whole_b():
    """run_float packs a resident B into one TN x K buffer: a call with TN < N would write
    past it (heap corruption), so it is refused before any kernel runs."""
    import numpy as np

    from torchfl.kernels.gemm import run_float

    M, K, N = 8, 16, 64
    A = np.zeros(M * K, np.float32)
    B = np.zeros(K * N, np.float32)
    C = np.zeros(M * N, np.float32)
    rows = (np.arange(M, dtype=np.int64) * K).reshape(1, M)
    crows = (np.arange(M, dtype=np.int64) * N).reshape(1, M)
    with pytest.raises(ValueError, match="resident B needs TN >= N"):
        run_float(A, rows, 1, B, np.zeros(1, np.int64), N, 1, C, crows, 1, M=M, N=N, K=K, TM=8, TN=32, TK=16,
                  b_res=True, code=0, esa=4, esc=4)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("mkn,cache", [((37, 53, 40), 16 << 10), ((64, 300, 48), 256 << 10),
                                      ((13, 70, 33), 8 << 20), ((5, 8, 24), 8 << 20),
                                      ((1, 40, 24), 8 << 20), ((3, 33, 19), 16 << 10)])
@pytest.mark.parametrize("kernel", ["linear", "linear_gelu"])
def test_linear_frozen_weight_packed_once(dtype, mkn, cache, kernel):
    """A frozen weight (the executor's static values) is decoded and packed once and kept:
    the second call reads the kept panels; results are bit-identical to the unfrozen run and
    the counted traffic is the plan's either way. Freeing the buffer drops the copy."""
    from torchfl.kernels import frozen

    M, K, N = mkn
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(M + K + N)
    x = dev(torch.randn(M, K, generator=g), mem, dtype)
    w_plain = dev(torch.randn(N, K, generator=g), mem, dtype)
    w = dev(w_plain.to_torch().float(), mem, dtype)
    bias = dev(torch.randn(N, generator=g), mem, dtype)
    (ref,), _ = run_checked(kernel, chip, {"x": x, "w": w_plain, "bias": bias})
    frozen.freeze(w.buffer)
    before = frozen.cached_bytes()
    for _ in range(2):
        (c,), plan = run_checked(kernel, chip, {"x": x, "w": w, "bias": bias})
        np.testing.assert_array_equal(c.to_numpy(), ref.to_numpy())
    kept = frozen.cached_bytes() - before
    if uses_gemv(M, K, {"float32": 0, "float16": 1, "bfloat16": 2}[dtype], 1):  # streamed as stored: nothing kept
        assert kept == 0
    else:            # B packed in NR-column panels, tile by tile of TN columns
        tn = min(plan.config.tile("n"), N)
        assert kept == -(-N // tn) * -(-tn // NR) * NR * K * 4
    assert_close(as_f32(c), F.linear(as_f32(x), as_f32(w), as_f32(bias)) if kernel == "linear"
                 else F.gelu(F.linear(as_f32(x), as_f32(w), as_f32(bias))), dtype, scale=2)
    w.buffer.free()
    assert frozen.derived(w.buffer, "any", lambda: 1 / 0) is None
    assert frozen.cached_bytes() == before


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "bfloat16_emulated"])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize("kernel,frozen_w", [("linear", False), ("linear", True), ("linear_gelu", True)])
def test_linear_decode_rows(dtype, m, kernel, frozen_w):
    """Decode-shaped linear (a few rows, the few-row GEMV path: gemv.uses_gemv): columns in
    groups of four and a remainder (N = 4k + 3), K not a vector multiple, fp16/bf16 weights
    streamed as stored; against torch in float32 within the dtype's tolerance, counted ==
    predicted (run_checked), the same result whether or not the weight is kept."""
    from torchfl.kernels import frozen

    K, N = 301, 39
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(m)
    x = dev(torch.randn(m, K, generator=g), mem, dtype)
    w = dev(torch.randn(N, K, generator=g) * 0.1, mem, dtype)
    bias = dev(torch.randn(N, generator=g), mem, dtype)
    if frozen_w:
        frozen.freeze(w.buffer)
    (c,), plan = run_checked(kernel, chip, {"x": x, "w": w, "bias": bias})
    ref = F.linear(as_f32(x), as_f32(w), as_f32(bias))
    assert_close(as_f32(c), ref if kernel == "linear" else F.gelu(ref), dtype, scale=2)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_linear_decode_batched_rows(dtype):
    """x[B, 1, K] (a decode step of a batch): M = B rows, one weight, through the few-row path."""
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(7)
    x = dev(torch.randn(3, 1, 64, generator=g), mem, dtype)
    w = dev(torch.randn(20, 64, generator=g), mem, dtype)
    (c,), _ = run_checked("linear", chip, {"x": x, "w": w})
    assert tuple(c.shape) == (3, 1, 20)
    assert_close(as_f32(c), F.linear(as_f32(x), as_f32(w)), dtype, scale=2)
