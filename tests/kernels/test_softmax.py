"""Softmax family vs torch/autograd: dims, layouts, dtypes, whole-row and row_split tiling."""
import pytest
import torch

from torchfl.kernels import DeviceMemory

from .helpers import as_f32, assert_close, bytes_monotone, chip_for, dev, run_checked

DT = ["float32", "float16", "bfloat16", "bfloat16_emulated"]
CASES = [((4, 3, 5, 7), -1, None), ((4, 3, 5, 7), 1, "NHWC"), ((2, 3, 4, 9), 3, "WNCH"), ((1,), 0, None),
         ((0, 5), 1, None), ((3, 1031), -1, None), ((6, 1), 1, None)]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape,dim,layout", CASES)
@pytest.mark.parametrize("cache", (1 << 10, 8 << 20))    # 1 KiB forces row_split for long rows
@pytest.mark.parametrize("log", [False, True])
def test_softmax_forward(dtype, shape, dim, layout, cache, log):
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    x = dev(torch.randn(*shape) * 3, mem, dtype, layout)
    name = "log_softmax" if log else "softmax"
    (y,), plan = run_checked(name, chip, {"x": x}, {"dim": dim})
    ref = (torch.log_softmax if log else torch.softmax)(as_f32(x), dim)
    assert y.layout == x.layout
    assert_close(as_f32(y), ref, dtype, what=f"{name} {plan.config.strategy}")


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape,dim,layout", CASES)
@pytest.mark.parametrize("cache", (1 << 10, 8 << 20))
@pytest.mark.parametrize("log", [False, True])
def test_softmax_backward_vs_autograd(dtype, shape, dim, layout, cache, log):
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    xd = dev(torch.randn(*shape), mem, dtype, layout)
    x = as_f32(xd).requires_grad_(True)
    fn = torch.log_softmax if log else torch.softmax
    out = fn(x, dim)
    gd = dev(torch.randn(*shape), mem, dtype, layout)
    od = dev(out.detach(), mem, dtype, layout)
    (ref,) = torch.autograd.grad(out, x, as_f32(gd)) if out.numel() else (torch.zeros(shape),)
    name = "log_softmax_backward" if log else "softmax_backward"
    (y,), _ = run_checked(name, chip, {"grad": gd, "out": od}, {"dim": dim})
    assert_close(as_f32(y), ref, dtype, scale=4, what=name)


def test_row_split_reads_twice():
    from torchfl.kernels.catalog import CATALOG

    chip = chip_for("float32", 1 << 10)
    spec = CATALOG["softmax"]
    plan = spec.tile(spec.problem({"x": (3, 1031)}, {"dim": -1}), chip)
    assert plan.config.strategy == "row_split"
    assert plan.traffic.bytes_read == 2 * 3 * 1031 * 4 and plan.traffic.bytes_written == 3 * 1031 * 4


@pytest.mark.parametrize("name,shapes", [("softmax", {"x": (64, 5000)}), ("softmax_backward", {"grad": (64, 300), "out": (64, 300)})])
def test_bigger_cache_never_more_bytes(name, shapes):
    bytes_monotone(name, shapes, {"dim": -1}, "float32")
