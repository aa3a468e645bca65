"""The rounding family (kernels/rounding: div_rounding) against torch.div(rounding_mode=...):
trunc and floor, float32 / float16 / bfloat16 / int32 / int64, a tensor divisor (same shape and
broadcast), a scalar divisor, negative operands, zero divisors (floats: inf / NaN as torch;
integers: ZeroDivisionError as torch), NaN and +-inf, empty and permuted inputs; counted ==
predicted.

Tolerance: none for integers; floats equal torch's result computed from the same rounded
inputs in float32 and rounded once to the dtype (torch's CPU opmath), so exactly equal too."""
import pytest
import torch

from tests.kernels.helpers import as_f32, dev, run_checked
from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get

FLOATS = ("float32", "float16", "bfloat16")


def _floats():
    a = torch.tensor([7.0, -7.0, 7.5, -7.5, 0.0, -0.0, 1e-3, 5.0, float("nan"), float("inf"), -float("inf"), 3.0])
    b = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, -4.0, 0.0, 1.0, 2.0, 3.0, float("inf")])
    return a.view(3, 4), b.view(3, 4)


@pytest.mark.parametrize("cache", (1 << 20, 64))
@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_floats_match_torch(dtype, mode, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    a, b = _floats()
    t = getattr(torch, dtype)
    ref = torch.div(a.to(t).float(), b.to(t).float(), rounding_mode=mode).to(t).float()
    (y,), _ = run_checked("div_rounding", chip, {"a": dev(a, mem, dtype, layout=(1, 0)), "b": dev(b, mem, dtype)},
                          {"mode": mode})
    torch.testing.assert_close(as_f32(y), ref, rtol=0, atol=0, equal_nan=True)
    (y,), _ = run_checked("div_rounding", chip, {"a": dev(a, mem, dtype)}, {"mode": mode, "scalar": -2.0})
    ref = torch.div(a.to(t).float(), -2.0, rounding_mode=mode).to(t).float()
    torch.testing.assert_close(as_f32(y), ref, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("mode", ["trunc", "floor"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_integers_match_torch(dtype, mode):
    chip = ChipModel(cache_bytes=128)
    mem = DeviceMemory(chip)
    a = torch.arange(-12, 12, dtype=dtype).view(4, 6)
    b = torch.tensor([3, -3, 5, -5, 7, 1], dtype=dtype)                 # a broadcast row
    (y,), plan = run_checked("div_rounding", chip, {"a": dev(a, mem), "b": dev(b, mem)}, {"mode": mode})
    assert torch.equal(y.to_torch(), torch.div(a, b, rounding_mode=mode))
    (y,), _ = run_checked("div_rounding", chip, {"a": dev(a, mem)}, {"mode": mode, "scalar": 2})
    assert torch.equal(y.to_torch(), torch.div(a, 2, rounding_mode=mode))    # MoE: perm // top_k
    with pytest.raises(ZeroDivisionError):
        run_checked("div_rounding", chip, {"a": dev(a, mem)}, {"mode": mode, "scalar": 0})


def test_empty_and_refusals():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    (y,), _ = run_checked("div_rounding", chip, {"a": dev(torch.zeros(0, 3), mem, "float32")}, {"mode": "floor"})
    assert y.shape == (0, 3)
    with pytest.raises(KernelError, match="fractional"):
        get("div_rounding").problem({"a": (3,)}, {"mode": "floor", "scalar": 2.5}, dtypes={"a": "int64"})
    with pytest.raises(KernelError, match="rounding_mode"):
        get("div_rounding").problem({"a": (3,)}, {"mode": "round"})
    with pytest.raises(KernelError, match="do not broadcast"):
        get("div_rounding").problem({"a": (3,), "b": (4,)}, {"mode": "floor"})
