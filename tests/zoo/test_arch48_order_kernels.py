"""The order family (kernels/order: argmax, argmin, sort, topk) against torch: every dtype it
computes in, NaN / +-inf, ties, empty and non-contiguous (permuted) inputs, each strategy (one
resident tile, streamed lines, arg-reductions cut into chunks); counted == predicted.

Tolerance: none. The values are copied as stored and the indices are integers, so results
must equal torch's exactly (float16 / bfloat16 compared after torch rounds the same input)."""
import pytest
import torch

from tests.kernels.helpers import as_f32, dev, run_checked
from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get

CACHES = (1 << 20, 600, 40)     # resident, streamed lines, arg-reductions in chunks (sorts refuse)
FLOATS = ("float32", "float16", "bfloat16")


def _special(shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-4, 4, shape, generator=g).float()      # many ties
    flat = x.view(-1)
    flat[3], flat[7], flat[11] = float("nan"), float("inf"), float("-inf")
    if flat.numel() > 20:
        flat[17] = float("nan")
    return x


def _torch(dtype, x):
    return x.to(getattr(torch, dtype)) if dtype in FLOATS else x.to(getattr(torch, dtype))


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dtype", FLOATS + ("int32", "int64"))
@pytest.mark.parametrize("kernel", ["argmax", "argmin"])
def test_arg_reductions_match_torch(kernel, dtype, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = _special((3, 6, 5)) if dtype in FLOATS else torch.randint(-3, 3, (3, 6, 5)).to(getattr(torch, dtype))
    xt = _torch(dtype, x)
    fn = getattr(torch, kernel)
    for dim, keepdim in ((1, False), (-1, True), (0, False), (None, False), (None, True)):
        # a permuted input: the kernel reads it in logical order
        d = dev(x, mem, dtype if dtype in FLOATS else None, layout=(2, 0, 1))
        (y,), plan = run_checked(kernel, chip, {"x": d}, {"dim": dim, "keepdim": keepdim})
        ref = fn(xt, dim=dim, keepdim=keepdim) if dim is not None else fn(xt, keepdim=keepdim)
        assert y.dtype == "int64" and torch.equal(y.to_torch(), ref), (dim, keepdim)
    if cache == 40:
        assert plan.config.strategy == "line_split"


@pytest.mark.parametrize("cache", CACHES[:2])
@pytest.mark.parametrize("dtype", FLOATS + ("int32", "int64"))
@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_matches_torch(dtype, descending, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = _special((4, 9)) if dtype in FLOATS else torch.randint(-3, 3, (4, 9)).to(getattr(torch, dtype))
    xt = _torch(dtype, x)
    for dim in (-1, 0):
        d = dev(x, mem, dtype if dtype in FLOATS else None, layout=(1, 0))
        (v, i), _ = run_checked("sort", chip, {"x": d}, {"dim": dim, "descending": descending})
        rv, ri = torch.sort(xt, dim=dim, descending=descending, stable=True)
        assert v.dtype == dtype and i.dtype == "int64"
        got = as_f32(v) if dtype in FLOATS else v.to_torch()
        assert torch.equal(i.to_torch(), ri), dim
        torch.testing.assert_close(got, rv.float() if dtype in FLOATS else rv, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", FLOATS + ("int64",))
@pytest.mark.parametrize("largest", [True, False])
def test_topk_matches_torch(dtype, largest):
    """Values equal torch's; indices point at those values (torch leaves the order of ties
    to its kernel; ours is the stable sort's) and equal torch's where the values are distinct."""
    chip = ChipModel(cache_bytes=600)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 8, generator=g) if dtype in FLOATS else torch.randperm(48, generator=g).view(6, 8)
    if dtype in FLOATS:
        x[2, 3] = float("nan")
        x[4, 1] = float("inf")
    xt = _torch(dtype, x)
    for k in (0, 2, 8):
        d = dev(x, mem, dtype if dtype in FLOATS else None)
        (v, i), _ = run_checked("topk", chip, {"x": d}, {"k": k, "dim": -1, "largest": largest})
        rv, ri = torch.topk(xt, k, dim=-1, largest=largest)
        got = as_f32(v) if dtype in FLOATS else v.to_torch()
        torch.testing.assert_close(got, rv.float() if dtype in FLOATS else rv, rtol=0, atol=0, equal_nan=True)
        picked = xt.gather(-1, i.to_torch())
        torch.testing.assert_close(picked, rv, rtol=0, atol=0, equal_nan=True)
        if dtype in ("float32", "int64"):       # distinct values: the same indices
            assert torch.equal(i.to_torch(), ri)
        assert tuple(v.shape) == (6, k)


def test_empty_lines_and_refusals():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    (v, i), _ = run_checked("sort", chip, {"x": dev(torch.zeros(0, 5), mem, "float32")}, {"dim": -1})
    assert v.shape == (0, 5) and i.shape == (0, 5)
    (v, i), _ = run_checked("sort", chip, {"x": dev(torch.zeros(3, 0), mem, "float32")}, {"dim": -1})
    assert v.shape == (3, 0)
    (y,), _ = run_checked("argmax", chip, {"x": dev(torch.zeros(0, 4), mem, "float32")}, {"dim": 1})
    assert y.shape == (0,)
    with pytest.raises(KernelError, match="empty line"):
        get("argmax").problem({"x": (3, 0)}, {"dim": 1})
    with pytest.raises(KernelError, match="k=5 out of range"):
        get("topk").problem({"x": (3, 4)}, {"k": 5, "dim": -1})
    with pytest.raises(KernelError, match="does not fit"):
        get("sort").tile(get("sort").problem({"x": (2, 1000)}, {"dim": -1}), ChipModel(cache_bytes=4096))
