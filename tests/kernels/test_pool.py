"""Pooling family vs torch: forward, backward (autograd), 24 layouts, counted == predicted."""
import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory, DeviceTensor, KernelError
from torchfl.kernels.catalog import get
from .test_conv import close, dev, run_checked

ALL_LAYOUTS = ["".join(p) for p in itertools.permutations("NCHW")]

# (shape, kernel, stride, padding, dilation, ceil_mode)
MAX_CASES = [
    ((1, 1, 1, 1), 1, None, 0, 1, False),
    ((2, 3, 7, 9), 2, None, 0, 1, False),
    ((2, 5, 11, 13), 3, 2, 1, 1, True),
    ((1, 4, 10, 7), (3, 2), (2, 1), (1, 0), (2, 1), False),
    ((1, 2, 5, 5), 3, 3, 1, 1, True),
]


@pytest.mark.parametrize("case", MAX_CASES)
@pytest.mark.parametrize("cache", [8 << 20, 600])
def test_max_pool2d_and_backward(case, cache):
    shape, k, st, pad, dil, ceil = case
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=True)
    ref, ridx = F.max_pool2d(x, k, st, pad, dil, ceil_mode=ceil, return_indices=True)
    attrs = dict(kernel_size=k, stride=st, padding=pad, dilation=dil, ceil_mode=ceil, return_indices=True)
    (y, idx), _ = run_checked("max_pool2d", chip, {"x": dev(x.detach(), mem, "NHWC")}, attrs)
    np.testing.assert_array_equal(y.to_numpy(), ref.detach().numpy())
    np.testing.assert_array_equal(idx.to_numpy(), ridx.numpy())
    gy = torch.randn_like(ref)
    ref.backward(gy)
    battrs = {k2: v for k2, v in attrs.items() if k2 != "return_indices"}
    (dx,), _ = run_checked("max_pool2d_backward", chip,
                           {"grad_out": dev(gy, mem, "NCWH"), "indices": dev(ridx, mem, "NCWH")},
                           {**battrs, "input_shape": shape})
    close(dx.to_numpy(), x.grad.numpy(), "float32")


@pytest.mark.parametrize("case", MAX_CASES + [((1, 16, 28, 28), 3, 2, 1, 1, False)])
@pytest.mark.parametrize("cache", [8 << 20, 3000, 600])
@pytest.mark.parametrize("layout,dtype", [("NCHW", "float16"), ("NHWC", "float32"), ("CWNH", "bfloat16")])
@pytest.mark.parametrize("with_idx", [False, True])
def test_max_pool2d_tile_kernel(case, cache, layout, dtype, with_idx):
    """max_pool2d pools each tile channel-parallel from a -inf-haloed plane (separable
    without indices, tap by tap with them): exact vs torch, indices included (ceil_mode,
    dilation, several tiles, -inf and NaN inputs: an all -inf window points at its first
    in-bounds tap, as torch's does) and counted == predicted."""
    shape, k, st, pad, dil, ceil = case
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(5)
    x = torch.randn(*shape).to(getattr(torch, dtype))
    x.view(-1)[::7] = float("-inf")
    x.view(-1)[x.numel() // 2] = float("nan")
    attrs = dict(kernel_size=k, stride=st, padding=pad, dilation=dil, ceil_mode=ceil, return_indices=with_idx)
    outs, _ = run_checked("max_pool2d", chip, {"x": dev(x, mem, layout)}, attrs)
    assert outs[0].dtype == dtype
    ref, ridx = F.max_pool2d(x.float(), k, st, pad, dil, ceil_mode=ceil, return_indices=True)
    np.testing.assert_array_equal(outs[0].to_numpy(), ref.numpy())
    if with_idx:
        np.testing.assert_array_equal(outs[1].to_numpy(), ridx.numpy())


AVG_CASES = [
    ((2, 3, 7, 9), 2, None, 0, False, True, None),
    ((1, 4, 11, 10), 3, 2, 1, True, False, None),
    ((2, 2, 9, 8), (3, 2), (2, 1), (1, 1), False, True, None),
    ((1, 3, 6, 6), 3, 2, 1, True, True, 5),
]


@pytest.mark.parametrize("case", AVG_CASES)
@pytest.mark.parametrize("cache", [8 << 20, 500])
def test_avg_pool2d_and_backward(case, cache):
    shape, k, st, pad, ceil, incl, div = case
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(1)
    x = torch.randn(*shape, requires_grad=True)
    ref = F.avg_pool2d(x, k, st, pad, ceil, incl, div)
    attrs = dict(kernel_size=k, stride=st, padding=pad, ceil_mode=ceil, count_include_pad=incl,
                 divisor_override=div)
    (y,), _ = run_checked("avg_pool2d", chip, {"x": dev(x.detach(), mem, "HWCN")}, attrs)
    close(y.to_numpy(), ref.detach().numpy(), "float32")
    gy = torch.randn_like(ref)
    ref.backward(gy)
    (dx,), _ = run_checked("avg_pool2d_backward", chip, {"grad_out": dev(gy, mem, "NHWC")},
                           {**attrs, "input_shape": shape})
    close(dx.to_numpy(), x.grad.numpy(), "float32")


@pytest.mark.parametrize("shape,out", [((2, 3, 7, 9), (3, 4)), ((1, 5, 8, 8), 1), ((1, 2, 5, 3), (7, 6)),
                                       ((1, 1, 1, 1), (1, 1))])
@pytest.mark.parametrize("cache", [8 << 20, 400])
def test_adaptive_avg_pool2d_and_backward(shape, out, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(2)
    x = torch.randn(*shape, requires_grad=True)
    ref = F.adaptive_avg_pool2d(x, out)
    (y,), _ = run_checked("adaptive_avg_pool2d", chip, {"x": dev(x.detach(), mem, "NHWC")},
                          {"output_size": out})
    close(y.to_numpy(), ref.detach().numpy(), "float32")
    gy = torch.randn_like(ref)
    ref.backward(gy)
    (dx,), _ = run_checked("adaptive_avg_pool2d_backward", chip, {"grad_out": dev(gy, mem)},
                           {"output_size": out, "input_shape": shape})
    close(dx.to_numpy(), x.grad.numpy(), "float32")


@pytest.mark.parametrize("layout", ALL_LAYOUTS)
def test_pools_every_layout(layout):
    chip = ChipModel(cache_bytes=2048)
    mem = DeviceMemory(chip)
    torch.manual_seed(3)
    x = torch.randn(2, 3, 7, 6)
    X = dev(x, mem, layout)
    (y,), _ = run_checked("max_pool2d", chip, {"x": X}, {"kernel_size": 3, "stride": 2, "padding": 1})
    assert (y.layout or "NCHW") == layout
    np.testing.assert_array_equal(y.to_numpy(), F.max_pool2d(x, 3, 2, 1).numpy())
    (y,), _ = run_checked("avg_pool2d", chip, {"x": X}, {"kernel_size": 2, "stride": 1})
    close(y.to_numpy(), F.avg_pool2d(x, 2, 1).numpy(), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_pool_half(dtype):
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(2, 4, 9, 9).to(getattr(torch, dtype))
    (y,), _ = run_checked("max_pool2d", chip, {"x": dev(x, mem, "NHWC")}, {"kernel_size": 2})
    assert y.dtype == dtype
    np.testing.assert_array_equal(y.to_numpy(), F.max_pool2d(x.float(), 2).numpy())
    (y,), _ = run_checked("avg_pool2d", chip, {"x": dev(x, mem, "NHCW")}, {"kernel_size": 3, "stride": 2})
    close(y.to_numpy(), F.avg_pool2d(x.float(), 3, 2).numpy(), dtype)


def test_max_pool_nan_propagates():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(1, 1, 4, 4)
    x[0, 0, 1, 1] = float("nan")
    (y,), _ = run_checked("max_pool2d", chip, {"x": dev(x, mem)}, {"kernel_size": 2})
    np.testing.assert_array_equal(np.isnan(y.to_numpy()), np.isnan(F.max_pool2d(x, 2).numpy()))


def test_pool_bigger_cache_never_moves_more():
    for name, attrs in [("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}),
                        ("avg_pool2d", {"kernel_size": 3, "stride": 1}),
                        ("adaptive_avg_pool2d", {"output_size": (5, 3)})]:
        spec = get(name)
        prob = spec.problem({"x": (4, 32, 29, 31)}, attrs, "float32", {"x": "NHWC"})
        last = None
        for kb in [1, 2, 8, 64, 512, 8192]:
            b = spec.tile(prob, ChipModel(cache_bytes=kb << 10)).traffic.bytes
            assert last is None or b <= last
            last = b


def test_pool_bad_attrs():
    spec = get("max_pool2d")
    with pytest.raises(KernelError, match="at most half"):
        spec.problem({"x": (1, 1, 5, 5)}, {"kernel_size": 2, "padding": 2}, "float32")
    with pytest.raises(KernelError, match="4-D"):
        spec.problem({"x": (1, 5, 5)}, {"kernel_size": 2}, "float32")


def test_pool_output_size_is_torchs_rule_including_windows_wider_than_the_input():
    """ceil_mode with a window wider than the map gives one output (EfficientNet's pooler
    ``AvgPool2d(1280, ceil_mode=True)``); it gave 0 and the op fell back."""
    import itertools

    from torchfl.kernels.conv.geometry import pool_out_size

    for n, k, s, p, d, ceil in itertools.product(range(1, 10), range(1, 8), range(1, 4), range(3), (1, 2),
                                                 (False, True)):
        if p > k // 2:
            continue
        try:
            ref = torch.nn.functional.max_pool2d(torch.zeros(1, 1, n, 1), (k, 1), (s, 1), (p, 0), (d, 1),
                                                 ceil_mode=ceil).shape[2]
        except RuntimeError:   # torch: output size is too small
            ref = 0
        assert pool_out_size(n, k, s, p, d, ceil) == ref, (n, k, s, p, d, ceil)
