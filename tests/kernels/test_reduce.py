"""sum / mean / amax vs torch over dims, keepdim, layouts, dtypes; counted == predicted."""
import numpy as np
import pytest
import torch

from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get
from .test_conv import close, dev, run_checked

CASES = [((3, 4, 5), None, False, None), ((3, 4, 5), 1, True, None), ((2, 3, 4, 5), (0, 2), False, "NHWC"),
         ((7,), 0, False, None), ((1, 1), (-1,), True, None), ((4, 6, 8), (2, 0), True, "CLN"),
         ((5, 0, 3), 1, False, None), ((0, 3), 1, False, None)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", ["sum", "mean", "amax"])
@pytest.mark.parametrize("cache", [8 << 20, 64])
def test_reduce_matches_torch(case, name, cache):
    shape, dim, keep, layout = case
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = torch.randn(*shape)
    attrs = {"dim": dim, "keepdim": keep}
    tdim = tuple(range(len(shape))) if dim is None else dim
    if name == "amax":
        n_red = int(np.prod([shape[d] for d in ((tdim,) if isinstance(tdim, int) else tdim)]))
        if n_red == 0:
            with pytest.raises(KernelError, match="empty dim"):
                get("amax").problem({"x": shape}, attrs, "float32")
            return
        ref = torch.amax(x, dim=tdim, keepdim=keep)
    else:
        ref = getattr(torch, name)(x, dim=tdim, keepdim=keep)
    (y,), _ = run_checked(name, chip, {"x": dev(x, mem, layout)}, attrs)
    assert y.shape == tuple(ref.shape)
    np.testing.assert_allclose(y.to_numpy(), ref.numpy(), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduce_half(dtype):
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(6, 50).to(getattr(torch, dtype))
    (y,), _ = run_checked("sum", chip, {"x": dev(x, mem)}, {"dim": 1})
    assert y.dtype == dtype
    close(y.to_numpy(), x.float().sum(1).numpy(), dtype, scale=3)
    (y,), _ = run_checked("amax", chip, {"x": dev(x, mem)}, {"dim": 0})
    np.testing.assert_array_equal(y.to_numpy(), x.float().amax(0).numpy())


def test_amax_nan_and_bad_dim():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(3, 4)
    x[1, 2] = float("nan")
    (y,), _ = run_checked("amax", chip, {"x": dev(x, mem)}, {"dim": 1})
    np.testing.assert_array_equal(np.isnan(y.to_numpy()), np.isnan(x.amax(1).numpy()))
    with pytest.raises(KernelError, match="out of range"):
        get("sum").problem({"x": (3, 4)}, {"dim": 2}, "float32")
    with pytest.raises(KernelError, match="twice"):
        get("sum").problem({"x": (3, 4)}, {"dim": (1, -1)}, "float32")


BOOL_CASES = [((3, 4, 5), None, False, None), ((3, 4, 5), -1, True, None), ((2, 3, 4, 5), (0, 2), False, "NHWC"),
              ((5, 0, 3), 1, False, None), ((0, 3), 0, True, None), ((6, 33), 1, False, None)]


@pytest.mark.parametrize("case", BOOL_CASES)
@pytest.mark.parametrize("name", ["any", "all"])
@pytest.mark.parametrize("dtype", ["bool", "float16", "int64"])
@pytest.mark.parametrize("cache", [8 << 20, 64])
def test_any_all_match_torch(case, name, dtype, cache):
    """Masks (bool), index values (int64) and floats with NaN, zeros and -0.0: nonzero is true."""
    shape, dim, keep, layout = case
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(len(shape) + (dim if isinstance(dim, int) else 0))
    x = torch.randint(0, 3, shape, generator=g) * (torch.rand(shape, generator=g) < 0.8)
    if len(shape) == 3 and shape[0] == 3:
        x[1] = 2              # a slice with every element true, one with none
        x[2] = 0
    if dtype == "bool":
        x = x != 0
    elif dtype == "float16":
        x = x.half()
        x.view(-1)[:2] = torch.tensor([float("nan"), -0.0]) if x.numel() >= 2 else x.view(-1)[:2]
    attrs = {"dim": dim, "keepdim": keep}
    tdim = tuple(range(len(shape))) if dim is None else dim
    ref = getattr(torch, name)(x, dim=tdim, keepdim=keep)
    (y,), _ = run_checked(name, chip, {"x": dev(x, mem, layout)}, attrs)
    assert y.dtype == "bool" and y.shape == tuple(ref.shape)
    np.testing.assert_array_equal(y.to_numpy(), ref.numpy())
