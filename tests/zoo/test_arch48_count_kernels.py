"""The count family (kernels/count: histc) against torch.histc: float32, float16, bfloat16,
a given range, the data's range (min == max: torch takes it for any equal pair), a constant input's
range widened by 1 each side,
NaN and +-inf, empty input, resident and streamed tiles; counted == predicted.

Tolerance: none (counts are integers; the input is rounded to its dtype first and torch counts
that same rounded input in float32)."""
import pytest
import torch

from tests.kernels.helpers import as_f32, dev, run_checked
from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get


@pytest.mark.parametrize("cache", (1 << 20, 160))
@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("bins,lo,hi", [(8, 0.0, 7.0), (5, -2.0, 2.0), (6, 0.0, 0.0), (3, 2.0, 2.0)],
                         ids=["expert-ids", "clipped", "data-range", "data-range-2"])
def test_histc_matches_torch(dtype, bins, lo, hi, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randint(0, 8, (40,), generator=g).float(), torch.randn(60, generator=g) * 3])
    if lo != hi:                                  # the data's range must be finite, as torch's
        x[5], x[17], x[33] = float("nan"), float("inf"), float("-inf")
    x = x.view(4, 25)
    ref = torch.histc(x.to(getattr(torch, dtype)).float(), bins=bins, min=lo, max=hi)
    (y,), plan = run_checked("histc", chip, {"x": dev(x, mem, dtype, layout=(1, 0))},
                             {"bins": bins, "lo": lo, "hi": hi})
    assert y.dtype == dtype and torch.equal(as_f32(y), ref)
    assert plan.config.strategy == ("resident" if cache > 1000 else "streamed")


@pytest.mark.parametrize("dtype", (torch.int32, torch.int64))
@pytest.mark.parametrize("lo,hi", [(0.0, 7.0), (0.0, 0.0), (2.0, 5.0)])
def test_histc_of_integers_as_cuda(dtype, lo, hi):
    """transformers' MoE routing on a non-CPU device: ``histc(expert_ids.int(), E, 0, E - 1)``;
    the counts in the input's dtype (CUDA's result), equal to torch's counts of the same floats."""
    chip = ChipModel()
    mem = DeviceMemory(chip)
    ids = torch.randint(0, 8, (3, 30), generator=torch.Generator().manual_seed(2)).to(dtype)
    (y,), _ = run_checked("histc", chip, {"x": dev(ids, mem)}, {"bins": 8, "lo": lo, "hi": hi})
    assert y.dtype == str(dtype).split(".")[1]
    assert torch.equal(y.to_torch(), torch.histc(ids.float(), bins=8, min=lo, max=hi).to(dtype))


def test_histc_empty_and_refusals():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    (y,), _ = run_checked("histc", chip, {"x": dev(torch.zeros(0), mem, "float32")}, {"bins": 4, "lo": 0.0, "hi": 3.0})
    assert as_f32(y).tolist() == [0, 0, 0, 0]
    (y,), _ = run_checked("histc", chip, {"x": dev(torch.full((2,), 3.0), mem, "float32")}, {"bins": 4, "lo": 0.0, "hi": 0.0})
    assert torch.equal(as_f32(y), torch.histc(torch.full((2,), 3.0), bins=4))      # [2, 4] widened: [0, 0, 2, 0]
    with pytest.raises(KernelError, match="max 1.0 must be larger"):
        get("histc").problem({"x": (4,)}, {"bins": 4, "lo": 2.0, "hi": 1.0})
    with pytest.raises(KernelError, match="use fewer bins"):
        get("histc").tile(get("histc").problem({"x": (4,)}, {"bins": 1000}), ChipModel(cache_bytes=4096))


@pytest.mark.parametrize("cache", (1 << 20, 200, 48))
@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
@pytest.mark.parametrize("to", ("int32", "int64"))
def test_offsets_match_torch_cumsum_into_ints(dtype, to, cache):
    """cumsum(x, dtype=int): torch casts first (toward zero), then sums exactly; each strategy."""
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = torch.tensor([[3.0, 0.0, 5.7, -2.5, 8.0, 1.0], [2.9, -0.9, 4.0, 6.0, 0.0, 7.0]])
    xt = x.to(getattr(torch, dtype))
    strategies = set()
    for dim in (1, 0):
        (y,), plan = run_checked("offsets", chip, {"x": dev(x, mem, dtype, layout=(1, 0))}, {"dim": dim, "to": to})
        assert y.dtype == to
        assert torch.equal(y.to_torch(), torch.cumsum(xt, dim, dtype=getattr(torch, to)))
        strategies.add(plan.config.strategy)
    if cache == 48:
        assert "line_split" in strategies, strategies
