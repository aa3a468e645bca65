"""scan (cumsum) and pad (constant_pad) families vs torch; counted == predicted; every strategy."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get

from .helpers import as_f32, assert_close, dev, run_checked

CACHES = (1 << 20, 200, 48)   # resident, streamed lines, lines cut into chunks


@pytest.mark.parametrize("cache", CACHES)
def test_cumsum_mask_positions_int_and_bool(cache):
    """Position ids from an attention mask: bool/int32/int64 sum exactly into int64, as torch."""
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    m = torch.rand(2, 16) > 0.3
    for x in (m, m.int(), m.long() * 3 - 1):
        (y,), plan = run_checked("cumsum", chip, {"x": dev(x, mem)}, {"dim": -1})
        assert y.dtype == "int64" and torch.equal(y.to_torch(), torch.cumsum(x, -1))
    (y,), _ = run_checked("cumsum", chip, {"x": dev(m.int(), mem)}, {"dim": 1, "to": "int32"})
    assert torch.equal(y.to_torch(), torch.cumsum(m.int(), 1, dtype=torch.int32))
    if cache == 48:
        assert plan.config.strategy == "line_split"


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cumsum_floats_nan_inf_and_layout(dtype, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = torch.randn(3, 5, 4)
    x[1, 2, 3], x[0, 1, 1], x[2, 0, 0] = float("nan"), float("inf"), float("-inf")
    xs = x.to(getattr(torch, dtype))
    (y,), _ = run_checked("cumsum", chip, {"x": dev(x, mem, dtype, layout=(2, 0, 1))}, {"dim": -2})
    assert_close(as_f32(y), torch.cumsum(xs.float(), -2), dtype, what="cumsum")


def test_cumsum_empty_and_errors():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    (y,), _ = run_checked("cumsum", chip, {"x": dev(torch.zeros(2, 0), mem)}, {"dim": 1})
    assert y.shape == (2, 0)
    with pytest.raises(KernelError, match="dim 2 out of range"):
        get("cumsum").problem({"x": (2, 3)}, {"dim": 2})
    with pytest.raises(KernelError, match="cast the input first"):
        get("cumsum").problem({"x": (2, 3)}, {"dim": 0, "to": "float32"}, dtypes={"x": "int64"})


@pytest.mark.parametrize("cache", (1 << 20, 200))
@pytest.mark.parametrize("pad,layout", [((1, 2, 0, 1), None), ((1, 1, 1, 1), "NHCW"), ((0, 0, 0, 0, 0, 0), None),
                                        ((-1, 2, 3, -2), "NHWC"), ((1, 0, 0, 0, 2, 1, 1, 0), None)])
def test_constant_pad_any_layout_and_crop(pad, layout, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = torch.randn(2, 3, 5, 4)
    x[0, 0, 0, 0], x[1, 2, 4, 3] = float("nan"), float("inf")
    (y,), _ = run_checked("constant_pad", chip, {"x": dev(x, mem, layout=layout)}, {"pad": pad, "value": 0.5})
    assert y.layout == dev(x, mem, layout=layout).layout
    torch.testing.assert_close(y.to_torch(), F.pad(x, pad, value=0.5), equal_nan=True, rtol=0, atol=0)


def test_constant_pad_half_bool_and_empty():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(2, 3, 5, 4)
    (y,), _ = run_checked("constant_pad", chip, {"x": dev(x, mem, "float16", layout="NHCW")},
                          {"pad": (1, 1, 2, 0), "value": float("-inf")})
    assert torch.equal(as_f32(y), F.pad(x.half(), (1, 1, 2, 0), value=float("-inf")).float())
    b = torch.rand(3, 4) > 0.5
    (y,), _ = run_checked("constant_pad", chip, {"x": dev(b, mem)}, {"pad": (1, 1), "value": 1})
    assert torch.equal(y.to_torch(), F.pad(b, (1, 1), value=True))
    (y,), _ = run_checked("constant_pad", chip, {"x": dev(torch.zeros(0, 3), mem)}, {"pad": (1, 1)})
    assert y.shape == (0, 5)
    with pytest.raises(KernelError, match="below zero size"):
        get("constant_pad").problem({"x": (2, 3)}, {"pad": (-2, -2)})
