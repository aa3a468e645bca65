"""conv1d (conv2d with H = 1) and group_norm vs torch; counted == predicted; every strategy."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get

from .helpers import as_f32, assert_close, dev, run_checked


@pytest.mark.parametrize("groups,layout", [(1, None), (4, None), (8, (0, 2, 1))])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_conv1d_grouped_depthwise_any_layout(groups, layout, dtype):
    chip = ChipModel(cache_bytes=1 << 16)
    mem = DeviceMemory(chip)
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 8, 40), torch.randn(16, 8 // groups, 5), torch.randn(16)
    (y,), plan = run_checked("conv1d", chip, {"x": dev(x, mem, dtype, layout), "weight": dev(w, mem, dtype),
                                              "bias": dev(b, mem, dtype)},
                             {"stride": (2,), "padding": (3,), "dilation": (2,), "groups": groups})
    rd = lambda t: t.to(getattr(torch, dtype)).float()   # noqa: E731
    assert_close(as_f32(y), F.conv1d(rd(x), rd(w), rd(b), 2, 3, 2, groups), dtype, scale=4, what="conv1d")
    assert plan.kernel == "conv1d"


def test_conv1d_plan_is_conv2d_plan_and_errors():
    chip = ChipModel(cache_bytes=1 << 14)
    p1 = get("conv1d").problem({"x": (2, 8, 40), "weight": (4, 8, 3)}, {"padding": (1,)})
    p2 = get("conv2d").problem({"x": (2, 8, 1, 40), "weight": (4, 8, 1, 3)}, {"padding": (0, 1)})
    assert get("conv1d").tile(p1, chip).traffic == get("conv2d").tile(p2, chip).traffic
    with pytest.raises(KernelError, match="must be 3-D"):
        get("conv1d").problem({"x": (2, 8, 1, 40), "weight": (4, 8, 3)})


@pytest.mark.parametrize("cache", (1 << 20, 256, 64))
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_group_norm(dtype, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 6, 19) * 3 + 1, torch.randn(6), torch.randn(6)
    rd = lambda t: t.to(getattr(torch, dtype)).float()   # noqa: E731
    (y, m, r), plan = run_checked("group_norm", chip, {"x": dev(x, mem, dtype), "weight": dev(w, mem, dtype),
                                                       "bias": dev(b, mem, dtype)}, {"groups": 3})
    ref = torch.ops.aten.native_group_norm(rd(x), rd(w), rd(b), 2, 6, 19, 3, 1e-5)
    assert_close(as_f32(y), ref[0], dtype, scale=2, what="group_norm")
    assert m.dtype == r.dtype == "float32" and m.shape == (2, 3)
    torch.testing.assert_close(m.to_torch(), ref[1], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(r.to_torch(), ref[2], rtol=1e-4, atol=1e-5)
    assert plan.config.strategy == {1 << 20: "resident", 256: plan.config.strategy, 64: "chunked"}[cache]


def test_group_norm_nan_propagates_in_its_group_only_and_4d():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(2, 4, 3, 5)
    x[0, 0, 1, 1] = float("nan")
    (y, m, r), _ = run_checked("group_norm", chip, {"x": dev(x, mem)}, {"groups": 2, "eps": 1e-3})
    ref = torch.ops.aten.native_group_norm(x, None, None, 2, 4, 15, 2, 1e-3)
    torch.testing.assert_close(y.to_torch(), ref[0], equal_nan=True, rtol=1e-4, atol=1e-5)
    with pytest.raises(KernelError, match="do not split into 3 groups"):
        get("group_norm").problem({"x": (2, 4, 5)}, {"groups": 3})
