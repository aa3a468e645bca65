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


@pytest.mark.parametrize("dtype", ["bool", "int32", "int64"])
@pytest.mark.parametrize("case", [((2, 3, 4, 5), (0, 2), False, "NHWC"), ((7, 9), None, False, None),
                                  ((2, 6), 1, True, None)])
def test_sum_of_bools_and_integers_is_exact_int64(dtype, case):
    """A padding mask's count (HF decoders: ``mask.sum()``) and id sums: int64, exact, as torch."""
    shape, dim, keep, layout = case
    chip = ChipModel(cache_bytes=64)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(4)
    x = torch.randint(-(2 ** 40), 2 ** 40, shape, generator=g)
    x = x > 0 if dtype == "bool" else x.to(getattr(torch, dtype))
    attrs = {"dim": dim, "keepdim": keep}
    ref = x.sum() if dim is None else x.sum(dim=dim, keepdim=keep)
    (y,), _ = run_checked("sum", chip, {"x": dev(x, mem, layout)}, attrs)
    assert y.dtype == "int64" and torch.equal(torch.from_numpy(y.to_numpy()).reshape(ref.shape), ref)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("order", [2, 1, float("inf"), float("-inf"), 0, 3.5, -2.1])
@pytest.mark.parametrize("cache", [8 << 20, 64])
def test_vector_norm_matches_torch(case, order, cache):
    """Every order over dims, layouts, a streamed (64 B) and a resident cache, counted == predicted
    (run_checked). float64 accumulation: float32 within 1e-6 of torch's (also float64 on the CPU)."""
    shape, dim, keep, layout = case
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=g)
    if x.numel() > 3:
        x.view(-1)[:3] = torch.tensor([0.0, -0.0, 2.5])
    attrs = {"dim": dim, "keepdim": keep, "ord": order}
    reduced = range(len(shape)) if dim is None else [d % len(shape) for d in ((dim,) if isinstance(dim, int) else dim)]
    n_red = int(np.prod([shape[d] for d in reduced]))
    if n_red == 0 and x.numel() == 0 and len(reduced) < len(shape) and (order < 0 or order == float("inf")):
        with pytest.raises(KernelError, match="empty dim"):   # outputs exist, each the norm of nothing
            get("vector_norm").problem({"x": shape}, attrs, "float32")
        return
    ref = torch.linalg.vector_norm(x, order, dim=dim, keepdim=keep)
    (y,), _ = run_checked("vector_norm", chip, {"x": dev(x, mem, layout)}, attrs)
    assert y.shape == tuple(ref.shape)
    np.testing.assert_allclose(y.to_numpy(), ref.numpy(), rtol=1e-6, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_vector_norm_half_nan_inf(dtype):
    """16-bit inputs: one rounding of the float64 result (within one ulp of torch's); a NaN row stays
    NaN for every order but 0 (NaN is nonzero: counted), an inf row is inf."""
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = (torch.randn(5, 40) * 30).to(getattr(torch, dtype))
    x[1, 3], x[2, 7] = float("nan"), float("inf")
    eps = torch.finfo(x.dtype).eps
    for order in (2, 1, float("inf"), 0, 3.0):
        (y,), _ = run_checked("vector_norm", chip, {"x": dev(x, mem)}, {"dim": 1, "ord": order})
        assert y.dtype == dtype
        got = torch.from_numpy(np.asarray(y.to_numpy(), np.float32))
        ref = torch.linalg.vector_norm(x.double(), order, dim=1).float()
        torch.testing.assert_close(got, ref, rtol=eps, atol=0, equal_nan=True)


def test_vector_norm_refuses_what_it_cannot_compute():
    with pytest.raises(KernelError, match="order nan is not a number"):
        get("vector_norm").problem({"x": (3, 4)}, {"dim": 1, "ord": float("nan")}, "float32")
    with pytest.raises(KernelError, match="empty dim"):
        get("vector_norm").problem({"x": (3, 0)}, {"dim": 1, "ord": float("inf")}, "float32")
    p = get("vector_norm").problem({"x": (3, 0)}, {"dim": 1, "ord": 2}, "float32")   # 0: the sum of nothing
    assert p.shapes["x"] == (3, 0)
