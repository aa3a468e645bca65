"""conv2d family: results vs torch, counted bytes == predicted, layouts, dtypes, fusion."""
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory, DeviceTensor, KernelError
from torchfl.kernels.catalog import get

from .tolerances import TOL

ALL_LAYOUTS = ["".join(p) for p in itertools.permutations("NCHW")]


def run_checked(name, chip, inputs, attrs=None):
    """Run a kernel, assert counted traffic == its plan's traffic, return outputs and plan."""
    spec = get(name)
    prob = spec.problem({k: t.shape for k, t in inputs.items()}, attrs,
                        None if spec.mixed_dtypes else next(iter(inputs.values())).dtype,
                        {k: t.layout for k, t in inputs.items()},
                        {k: t.dtype for k, t in inputs.items()})
    plan = spec.tile(prob, chip)
    outs, counted = spec.run(chip, inputs, attrs, plan)
    assert counted == plan.traffic, (name, plan.config, counted, plan.traffic)
    return outs, plan


def close(ours, ref, dtype, scale=1.0):
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(ours, ref, rtol=rtol, atol=atol * scale)


def dev(t, mem, layout=None, dtype=None):
    return DeviceTensor.from_torch(t, mem, layout=layout, dtype=dtype)


# (N, C, H, W, K, R, S, stride, padding, dilation, groups, bias)
CASES = [
    (1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, False),
    (2, 3, 7, 5, 4, 3, 3, 1, 1, 1, 1, True),
    (1, 6, 11, 13, 6, 3, 3, 2, 1, 1, 6, True),      # depthwise
    (3, 4, 9, 8, 6, 2, 3, (2, 1), (0, 2), (1, 2), 2, False),
    (1, 5, 13, 17, 17, 5, 5, 3, 2, 1, 1, True),
    (2, 16, 10, 10, 24, 3, 3, 1, 1, 1, 1, True),    # micro-kernel path, K not a multiple of 16
    (0, 3, 5, 5, 4, 3, 3, 1, 1, 1, 1, True),        # empty batch
]


def _attrs(c):
    return dict(stride=c[7], padding=c[8], dilation=c[9], groups=c[10])


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("cache", [8 << 20, 6 << 10, 512])
def test_conv2d_matches_torch_and_counts(case, cache):
    N, C, H, W, K, R, S, st, pad, dil, g, has_bias = case
    torch.manual_seed(0)
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = torch.randn(N, C, H, W)
    w = torch.randn(K, C // g, R, S)
    b = torch.randn(K) if has_bias else None
    ins = {"x": dev(x, mem, "NHWC"), "weight": dev(w, mem)}
    if has_bias:
        ins["bias"] = dev(b, mem)
    (y,), plan = run_checked("conv2d", chip, ins, _attrs(case))
    ref = F.conv2d(x, w, b, stride=st, padding=pad, dilation=dil, groups=g)
    assert y.shape == tuple(ref.shape)
    close(y.to_numpy(), ref.numpy(), "float32", scale=np.sqrt(C * R * S))


def test_split_c_strategy_is_exercised_and_exact():
    chip = ChipModel(cache_bytes=3000)
    mem = DeviceMemory(chip)
    x, w = torch.randn(1, 40, 6, 6), torch.randn(20, 40, 3, 3)
    (y,), plan = run_checked("conv2d", chip, {"x": dev(x, mem, "NCHW"), "weight": dev(w, mem)},
                             {"padding": 1})
    assert plan.config.strategy == "split_c"
    close(y.to_numpy(), F.conv2d(x, w, padding=1).numpy(), "float32", scale=20)


@pytest.mark.parametrize("layout", ALL_LAYOUTS)
def test_conv2d_every_layout(layout):
    chip = ChipModel(cache_bytes=4096)
    mem = DeviceMemory(chip)
    torch.manual_seed(1)
    x, w, b = torch.randn(2, 4, 5, 7), torch.randn(6, 2, 3, 3), torch.randn(6)
    ins = {"x": dev(x, mem, layout), "weight": dev(w, mem, layout), "bias": dev(b, mem)}
    (y,), _ = run_checked("conv2d", chip, ins, {"padding": 1, "groups": 2, "stride": (1, 2)})
    assert y.layout in (layout, None) and (y.layout or "NCHW") == layout
    ref = F.conv2d(x, w, b, padding=1, groups=2, stride=(1, 2))
    close(y.to_numpy(), ref.numpy(), "float32", scale=5)


def test_bigger_cache_never_moves_more_bytes():
    spec = get("conv2d")
    for shape in [((4, 32, 28, 28), (64, 32, 3, 3)), ((1, 3, 31, 29), (8, 3, 7, 7)),
                  ((2, 64, 14, 14), (64, 1, 3, 3))]:
        g = 64 if shape[1][1] == 1 else 1
        prob = spec.problem({"x": shape[0], "weight": shape[1]}, {"padding": 1, "groups": g},
                            "float32", {"x": "NHWC"})
        last = None
        for kb in [1, 2, 4, 16, 64, 256, 1024, 8192]:
            t = spec.tile(prob, ChipModel(cache_bytes=kb << 10)).traffic.bytes
            assert last is None or t <= last, (shape, kb, t, last)
            last = t


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "bfloat16_emulated"])
def test_conv2d_half_dtypes(dtype):
    emu = dtype == "bfloat16_emulated"
    store = "bfloat16" if emu else dtype
    chip = ChipModel(bf16_emulation=emu)
    mem = DeviceMemory(chip)
    torch.manual_seed(2)
    tdt = getattr(torch, store)
    x, w, b = torch.randn(2, 8, 9, 9).to(tdt), torch.randn(16, 8, 3, 3).to(tdt), torch.randn(16).to(tdt)
    ins = {"x": dev(x, mem, "NHCW"), "weight": dev(w, mem), "bias": dev(b, mem)}
    (y,), _ = run_checked("conv2d_relu", chip, ins, {"padding": 1})
    assert y.dtype == store
    ref = F.relu(F.conv2d(x.float(), w.float(), b.float(), padding=1))
    close(y.to_numpy(), ref.numpy(), dtype, scale=3)


def test_conv2d_int8_exact():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    rng = np.random.default_rng(3)
    xq = rng.integers(-128, 128, (2, 5, 8, 9), dtype=np.int8)
    wq = rng.integers(-128, 128, (7, 5, 3, 3), dtype=np.int8)
    b = rng.standard_normal(7).astype(np.float32)
    sx, zx, sw = 0.05, 3, 0.02
    ins = {"x": DeviceTensor.from_numpy(xq, mem, "NHWC"), "weight": DeviceTensor.from_numpy(wq, mem),
           "bias": DeviceTensor.from_numpy(b, mem)}
    attrs = {"padding": 1, "x_scale": sx, "x_zero_point": zx, "w_scale": sw}
    (y,), _ = run_checked("conv2d", chip, ins, attrs)
    assert y.dtype == "float32"
    # exact int32 reference: padding is the real zero, i.e. q == zero_point
    xi = torch.from_numpy(xq.astype(np.int64) - zx)
    acc = F.conv2d(xi.double(), torch.from_numpy(wq.astype(np.float64)), padding=1)
    ref = (acc * (sx * sw)).float() + torch.from_numpy(b)[None, :, None, None]
    np.testing.assert_allclose(y.to_numpy(), ref.numpy(), rtol=1e-6, atol=1e-5)
    # requantised output
    (q,), _ = run_checked("conv2d", chip, ins, {**attrs, "out_scale": 0.5, "out_zero_point": -2})
    want = np.clip(np.round(ref.numpy() / np.float32(0.5)) - 2, -128, 127)
    assert q.dtype == "int8"
    assert np.abs(q.to_numpy().astype(np.int32) - want).max() <= 1


def test_conv_bad_inputs_are_clear():
    spec = get("conv2d")
    with pytest.raises(KernelError, match="larger than the padded input"):
        spec.problem({"x": (1, 2, 4, 4), "weight": (3, 2, 5, 5)}, {}, "float32")
    with pytest.raises(KernelError, match="C == weight.shape"):
        spec.problem({"x": (1, 3, 5, 5), "weight": (4, 2, 3, 3)}, {}, "float32")
    with pytest.raises(KernelError, match="bias must have shape"):
        spec.problem({"x": (1, 3, 5, 5), "weight": (4, 3, 3, 3), "bias": (3,)}, {}, "float32")
    with pytest.raises(KernelError, match="stride"):
        spec.problem({"x": (1, 3, 5, 5), "weight": (4, 3, 3, 3)}, {"stride": 0}, "float32")
    with pytest.raises(KernelError, match="4-D"):
        spec.problem({"x": (3, 5, 5), "weight": (4, 3, 3, 3)}, {}, "float32")


BWD = [
    (2, 4, 7, 6, 6, 3, 3, 1, 1, 1, 1),
    (1, 6, 9, 11, 6, 3, 3, 2, 1, 1, 3),
    (2, 3, 8, 7, 5, 2, 3, (2, 3), (1, 0), (2, 1), 1),
    (1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1),
    (1, 4, 5, 5, 8, 3, 3, 1, 1, 1, 4),
]


@pytest.mark.parametrize("case", BWD)
@pytest.mark.parametrize("cache", [8 << 20, 2048])
def test_conv_backward_matches_autograd(case, cache):
    N, C, H, W, K, R, S, st, pad, dil, g = case
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(5)
    x = torch.randn(N, C, H, W, requires_grad=True)
    w = torch.randn(K, C // g, R, S, requires_grad=True)
    b = torch.randn(K, requires_grad=True)
    y = F.conv2d(x, w, b, stride=st, padding=pad, dilation=dil, groups=g)
    gy = torch.randn_like(y)
    y.backward(gy)
    attrs = dict(stride=st, padding=pad, dilation=dil, groups=g)
    (dx,), _ = run_checked("conv2d_backward_input", chip,
                           {"grad_out": dev(gy, mem, "NHWC"), "weight": dev(w.detach(), mem)},
                           {**attrs, "input_shape": (N, C, H, W)})
    close(dx.to_numpy(), x.grad.numpy(), "float32", scale=np.sqrt(K * R * S))
    (dw, db), _ = run_checked("conv2d_backward_weight", chip,
                              {"grad_out": dev(gy, mem, "NCWH"), "x": dev(x.detach(), mem, "NHWC")},
                              {**attrs, "weight_shape": tuple(w.shape), "bias_grad": True})
    close(dw.to_numpy(), w.grad.numpy(), "float32", scale=np.sqrt(N * H * W))
    close(db.to_numpy(), b.grad.numpy(), "float32", scale=np.sqrt(N * H * W))


# ---------------------------------------------------------------- the head after the convs

@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("kernel,act", [("linear", lambda y: y), ("linear_relu", F.relu)])
@pytest.mark.parametrize("M", [1, 3])
@pytest.mark.parametrize("cache", [8 << 20, 16 << 10])
def test_classifier_head_few_rows_dot_product_path(dtype, kernel, act, M, cache):
    """A CNN's classifier (pooled features [M <= 4, K] x weight [N, K]): gemm.py computes
    it as one dot product per output (no 6-row micro-kernel); the same tiles are loaded and
    stored (counted == predicted, also with K tiled on a small cache), results as torch.
    K = 203 leaves a remainder after any vector width; N = 37 spreads over host threads."""
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(11)
    tdt = getattr(torch, dtype)
    x, w, b = torch.randn(M, 203).to(tdt), (torch.randn(37, 203) / 14).to(tdt), torch.randn(37).to(tdt)
    (y,), _ = run_checked(kernel, chip, {"x": dev(x, mem), "w": dev(w, mem), "bias": dev(b, mem)})
    ref = act(F.linear(x.float(), w.float(), b.float()))
    close(y.to_numpy().astype(np.float32), ref.numpy(), dtype, scale=3)
