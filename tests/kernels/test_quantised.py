"""Quantised kernels (qconv2d, qlinear, qadd, cast with quantize) against PyTorch's
reference quantised ops: PT2E's ``quantized_decomposed`` dequantize -> float op -> quantize.

Tolerance, stated: the kernels accumulate (x - zx)(w - zw) exactly in integers and apply
``v = acc * (sx * sw[k]) + bias`` once; the reference multiplies dequantised float32 values
and sums them in float32 in its own order. Both round ``v * float32(1 / out_scale)`` to
nearest even, so the int8 outputs agree except where the two float32 values of ``v`` fall
on opposite sides of a rounding boundary: at most one unit (one quantum) apart, and on
almost every element equal (checked: >= 99 %). Dequantised (float) outputs agree within
float32 summation error (rtol 1e-5 of the accumulated magnitude).
"""
import numpy as np
import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory, DeviceTensor
from torchfl.kernels.catalog import CATALOG
from torchfl.kernels.errors import KernelError

from .helpers import CACHES, run_checked

Q = torch.ops.quantized_decomposed


def _quantised(shape, gen, lo=-128, hi=127):
    return torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int8)


def _weights(k, gen, shape):
    w = _quantised(shape, gen, -127, 127)
    scales = (torch.rand(k, generator=gen) * 0.02 + 0.001).float()
    return w, scales


def _requant_ref(v, scale, zp):
    return Q.quantize_per_tensor.default(v, scale, zp, -128, 127, torch.int8)


def _agree(got: torch.Tensor, ref: torch.Tensor, what: str):
    diff = (got.to(torch.int32) - ref.to(torch.int32)).abs()
    assert int(diff.max()) <= 1, f"{what}: int8 outputs differ by {int(diff.max())} quanta"
    assert float((diff == 0).float().mean()) >= 0.99, f"{what}: only {float((diff == 0).float().mean()):.3f} equal"


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("cache", [CACHES[0], CACHES[2]])
@pytest.mark.parametrize("relu", [False, True])
def test_qconv2d_per_channel_matches_pt2e_reference(layout, cache, relu):
    gen = torch.Generator().manual_seed(1)
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = _quantised((2, 6, 9, 7), gen)
    w, ws = _weights(5, gen, (5, 6, 3, 3))
    bias = torch.randn(5, generator=gen)
    sx, zx, so, zo = 0.04, 3, 0.07, -5
    xf = Q.dequantize_per_tensor.default(x, sx, zx, -128, 127, torch.int8)
    wf = Q.dequantize_per_channel.default(w, ws, torch.zeros(5, dtype=torch.int64), 0, -127, 127, torch.int8)
    v = F.conv2d(xf, wf, bias, stride=(2, 1), padding=1)
    if relu:
        v = F.relu(v)
    ref = _requant_ref(v, so, zo)
    ins = {"x": DeviceTensor.from_torch(x, mem, layout=layout), "weight": DeviceTensor.from_torch(w, mem),
           "bias": DeviceTensor.from_torch(bias, mem), "w_scales": DeviceTensor.from_torch(ws, mem),
           "w_zero_points": DeviceTensor.from_torch(torch.zeros(5, dtype=torch.int64), mem)}
    attrs = {"stride": (2, 1), "padding": (1, 1), "x_scale": sx, "x_zero_point": zx, "out_scale": so,
             "out_zero_point": zo, "relu": relu}
    (y,), _plan = run_checked("qconv2d", chip, ins, attrs)
    assert y.dtype == "int8"
    _agree(y.to_torch(), ref, f"qconv2d {layout} relu={relu}")
    # dequantised output (the model's last layer): float32 within summation error
    (yf,), _ = run_checked("qconv2d", chip, ins, {**attrs, "out_scale": None, "out_dtype": "float32"})
    torch.testing.assert_close(yf.to_torch(), v, rtol=1e-5, atol=1e-5 * float(v.abs().max()))


def test_qconv2d_per_channel_zero_points_and_float16_out():
    """Asymmetric per-channel weights (zero points != 0) and a float16 dequantised output
    (the precision policy's on-chip dtype)."""
    gen = torch.Generator().manual_seed(2)
    chip = ChipModel(cache_bytes=CACHES[0])
    mem = DeviceMemory(chip)
    x = _quantised((1, 20, 6, 6), gen)
    w, ws = _weights(18, gen, (18, 20, 1, 1))
    wz = torch.randint(-5, 6, (18,), generator=gen)
    sx, zx = 0.02, -7
    xf = Q.dequantize_per_tensor.default(x, sx, zx, -128, 127, torch.int8)
    wf = Q.dequantize_per_channel.default(w, ws, wz, 0, -128, 127, torch.int8)
    ref = F.conv2d(xf, wf)
    ins = {"x": DeviceTensor.from_torch(x, mem), "weight": DeviceTensor.from_torch(w, mem),
           "w_scales": DeviceTensor.from_torch(ws, mem), "w_zero_points": DeviceTensor.from_torch(wz, mem)}
    (y,), _ = run_checked("qconv2d", chip, ins, {"x_scale": sx, "x_zero_point": zx, "out_dtype": "float16"})
    assert y.dtype == "float16"
    torch.testing.assert_close(y.to_torch().float(), ref.half().float(), rtol=1e-3, atol=1e-3)


def test_qconv2d_refuses_bad_calls():
    spec = CATALOG["qconv2d"]
    shapes = {"x": (1, 4, 5, 5), "weight": (2, 4, 3, 3)}
    with pytest.raises(KernelError, match="does not compute in float16"):
        spec.problem(shapes, {}, "float16", dtypes={"x": "float16", "weight": "float16"})
    with pytest.raises(KernelError, match="w_scales must be float32"):
        spec.problem({**shapes, "w_scales": (2,)}, {}, "int8", dtypes={"x": "int8", "weight": "int8",
                                                                        "w_scales": "float16"})
    with pytest.raises(KernelError, match="out_min/out_max"):
        spec.problem(shapes, {"out_scale": 0.1, "out_min": -200}, "int8", dtypes={"x": "int8", "weight": "int8"})


@pytest.mark.parametrize("cache", [CACHES[0], CACHES[2]])
@pytest.mark.parametrize("relu", [False, True])
def test_qlinear_per_channel_matches_pt2e_reference(cache, relu):
    gen = torch.Generator().manual_seed(3)
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = _quantised((3, 17, 96), gen)
    w, ws = _weights(40, gen, (40, 96))
    bias = torch.randn(40, generator=gen)
    sx, zx, so, zo = 0.03, -4, 0.05, 6
    xf = Q.dequantize_per_tensor.default(x, sx, zx, -128, 127, torch.int8)
    wf = Q.dequantize_per_channel.default(w, ws, torch.zeros(40, dtype=torch.int64), 0, -127, 127, torch.int8)
    v = F.linear(xf, wf, bias)
    if relu:
        v = F.relu(v)
    ins = {"x": DeviceTensor.from_torch(x, mem), "w": DeviceTensor.from_torch(w, mem),
           "bias": DeviceTensor.from_torch(bias, mem), "w_scales": DeviceTensor.from_torch(ws, mem)}
    attrs = {"x_scale": sx, "x_zero_point": zx, "out_scale": so, "out_zero_point": zo, "relu": relu}
    (y,), _ = run_checked("qlinear", chip, ins, attrs)
    assert y.dtype == "int8" and y.shape == (3, 17, 40)
    _agree(y.to_torch(), _requant_ref(v, so, zo), f"qlinear relu={relu}")
    (yf,), _ = run_checked("qlinear", chip, ins, {**attrs, "out_scale": None, "out_dtype": "float32"})
    torch.testing.assert_close(yf.to_torch(), v, rtol=1e-5, atol=1e-5 * float(v.abs().max()))


def test_qlinear_weight_zero_points_float16_out_and_saturation():
    """Per-channel weight zero points; a float16 dequantised output; a requantised output
    whose values saturate at out_min/out_max (here the weights' -127..127 range)."""
    gen = torch.Generator().manual_seed(4)
    chip = ChipModel(cache_bytes=CACHES[1])
    mem = DeviceMemory(chip)
    x = _quantised((5, 33), gen)
    w, ws = _weights(7, gen, (7, 33))
    wz = torch.randint(-3, 4, (7,), generator=gen)
    xf = Q.dequantize_per_tensor.default(x, 0.1, 0, -128, 127, torch.int8)
    wf = Q.dequantize_per_channel.default(w, ws, wz, 0, -128, 127, torch.int8)
    v = F.linear(xf, wf)
    ins = {"x": DeviceTensor.from_torch(x, mem), "w": DeviceTensor.from_torch(w, mem),
           "w_scales": DeviceTensor.from_torch(ws, mem), "w_zero_points": DeviceTensor.from_torch(wz, mem)}
    (yh,), _ = run_checked("qlinear", chip, ins, {"x_scale": 0.1, "out_dtype": "float16"})
    torch.testing.assert_close(yh.to_torch().float(), v.half().float(), rtol=1e-3, atol=1e-3)
    tiny = float(v.abs().max()) / 1000   # most values saturate
    (yq,), _ = run_checked("qlinear", chip, ins, {"x_scale": 0.1, "out_scale": tiny, "out_min": -127, "out_max": 127})
    ref = Q.quantize_per_tensor.default(v, tiny, 0, -127, 127, torch.int8)
    _agree(yq.to_torch(), ref, "qlinear saturating")
    assert int(yq.to_torch().min()) == -127


def test_int8_epilogue_vectors_counted_as_predicted_for_every_cache():
    """The weight scales and zero points are per-column vectors the tiling streams beside B:
    counted == predicted (run_checked) on a cache too small for B to stay resident."""
    gen = torch.Generator().manual_seed(5)
    for cache in CACHES:
        chip = ChipModel(cache_bytes=cache)
        mem = DeviceMemory(chip)
        x, (w, ws) = _quantised((64, 300), gen), _weights(200, gen, (200, 300))
        ins = {"x": DeviceTensor.from_torch(x, mem), "w": DeviceTensor.from_torch(w, mem),
               "w_scales": DeviceTensor.from_torch(ws, mem),
               "w_zero_points": DeviceTensor.from_torch(torch.zeros(200, dtype=torch.int64), mem)}
        _outs, plan = run_checked("qlinear", chip, ins, {"x_scale": 0.1, "out_scale": 0.2})
        assert plan.traffic.bytes_read >= 64 * 300 + 200 * 300 + 200 * 12


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_qadd_bit_exact_with_pt2e_reference(relu, layout):
    gen = torch.Generator().manual_seed(6)
    chip = ChipModel(cache_bytes=CACHES[0])   # several streamed tiles
    mem = DeviceMemory(chip)
    a, b = _quantised((2, 8, 30, 30), gen), _quantised((2, 8, 30, 30), gen)
    (sa, za), (sb, zb), (so, zo) = (0.011, -3), (0.017, 9), (0.023, -128 if relu else 2)
    v = (Q.dequantize_per_tensor.default(a, sa, za, -128, 127, torch.int8)
         + Q.dequantize_per_tensor.default(b, sb, zb, -128, 127, torch.int8))
    ref = _requant_ref(F.relu(v) if relu else v, so, zo)
    ins = {"a": DeviceTensor.from_torch(a, mem, layout=layout), "b": DeviceTensor.from_torch(b, mem, layout=layout)}
    (y,), plan = run_checked("qadd", chip, ins, {"a_scale": sa, "a_zero_point": za, "b_scale": sb,
                                                 "b_zero_point": zb, "out_scale": so, "out_zero_point": zo,
                                                 "relu": relu})
    assert plan.n_tiles > 1
    assert torch.equal(y.to_torch(), ref)


@pytest.mark.parametrize("to", ["float32", "float16"])
def test_cast_quantise_dequantise_bit_exact_with_pt2e(to):
    """quantize_per_tensor / dequantize_per_tensor as the cast kernel, bit-exact, incl. +-inf
    (saturate) and exact halves (round half to even). NaN is left out: torch's int8 of a NaN
    is undefined (the kernel writes 0)."""
    chip = ChipModel()
    mem = DeviceMemory(chip)
    gen = torch.Generator().manual_seed(7)
    scale, zp = 0.0123, -17
    x = torch.cat([torch.randn(997, generator=gen) * 2, torch.tensor([float("inf"), -float("inf"), 0.0]),
                   torch.arange(-20, 20) * scale / 2])   # exact halves: round half to even
    ref_q = Q.quantize_per_tensor.default(x, scale, zp, -128, 127, torch.int8)
    xin = x.to(getattr(torch, to))
    (q,), _ = run_checked("cast", chip, {"x": DeviceTensor.from_torch(xin, mem)},
                          {"to": "int8", "quantize": True, "scale": scale, "zero_point": zp})
    want = Q.quantize_per_tensor.default(xin.float(), scale, zp, -128, 127, torch.int8)
    assert torch.equal(q.to_torch(), want)
    if to == "float32":
        assert torch.equal(q.to_torch(), ref_q)
    (d,), _ = run_checked("cast", chip, {"x": q}, {"to": to, "quantize": True, "scale": scale, "zero_point": zp})
    ref_d = Q.dequantize_per_tensor.default(ref_q if to == "float32" else want, scale, zp, -128, 127, torch.int8)
    assert torch.equal(d.to_torch(), ref_d.to(getattr(torch, to)))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_cast_dequantise_per_channel_bit_exact(layout):
    chip = ChipModel(cache_bytes=CACHES[0])
    mem = DeviceMemory(chip)
    gen = torch.Generator().manual_seed(8)
    w, ws = _weights(12, gen, (12, 5, 3, 3))
    wz = torch.randint(-4, 5, (12,), generator=gen)
    ref = Q.dequantize_per_channel.default(w, ws, wz, 0, -128, 127, torch.int8)
    ins = {"x": DeviceTensor.from_torch(w, mem, layout=layout), "scales": DeviceTensor.from_torch(ws, mem),
           "zero_points": DeviceTensor.from_torch(wz, mem)}
    (y,), _ = run_checked("cast", chip, ins, {"to": "float32", "quantize": True, "axis": 0})
    assert torch.equal(y.to_torch(), ref)
    with pytest.raises(KernelError, match="scales must be float32 of shape"):
        CATALOG["cast"].problem({"x": (12, 5), "scales": (5,)}, {"to": "float32", "quantize": True}, "int8",
                                dtypes={"x": "int8", "scales": "float32"})
