"""index_put (kernels/index/put) against torch's index_put on the same inputs: the MoE inverse
permutation ``inv_perm[perm] = arange``, broadcast values, several index dims, negative
indices, a permuted (non-contiguous) x, NaN/inf carried, accumulate with repeated indices in
float32 / float16 / bfloat16 / int64 / bool, empty index; resident and streamed tiles;
counted == predicted.

Tolerance: none. Without accumulate the values are copied as stored; with it, each sum is
rounded to x's dtype in torch's order (CPU's serial accumulation), so float16 and bfloat16
results are bit-identical to torch's CPU kernel on the same rounded inputs."""
import pytest
import torch

from tests.kernels.helpers import dev, run_checked
from torchfl.kernels import ChipModel, DeviceMemory, KernelError
from torchfl.kernels.catalog import get

CACHES = (1 << 20, 96)      # resident, and a cache that forces streamed tiles


def _run(chip, x, indices, values, accumulate=False, layout=None):
    mem = DeviceMemory(chip)
    ins = {"x": dev(x, mem, layout=layout), "values": dev(values, mem)}
    ins.update({f"i{d}": dev(i, mem) for d, i in enumerate(indices) if i is not None})
    (y,), plan = run_checked("index_put", chip, ins, {"accumulate": accumulate})
    return y.to_torch(), plan


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dtype", (torch.int64, torch.int32))
def test_inverse_permutation_as_moe(cache, dtype):
    """transformers' grouped experts: ``inv_perm[perm] = arange(S)`` (S = tokens x top-k)."""
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(0)).to(dtype)
    x = torch.empty(64, dtype=dtype).fill_(-7)
    y, plan = _run(ChipModel(cache_bytes=cache), x, [perm], torch.arange(64, dtype=dtype))
    ref = x.clone()
    ref[perm] = torch.arange(64, dtype=dtype)
    assert torch.equal(y, ref)
    assert plan.config.strategy == ("resident" if cache > 1000 else "streamed")


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16))
def test_float_rows_broadcast_nan_inf_permuted(cache, dtype):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, 3, generator=g).to(dtype)
    x[0, 0, 0], x[4, 3, 2] = float("nan"), float("inf")
    i0, i2 = torch.tensor([[4], [-5]]), torch.tensor([[0, 2]])
    vals = torch.tensor([float("-inf"), 1.5, float("nan"), -2.0]).to(dtype)     # broadcast over (2, 2)
    xp = x.permute(2, 0, 1).contiguous().permute(1, 2, 0)                     # stored (3, 5, 4)
    y, _ = _run(ChipModel(cache_bytes=cache), xp, [i0, None, i2], vals, layout=(2, 0, 1))
    ref = x.clone()
    ref[i0, :, i2] = vals                        # separated index dims: the broadcast shape first
    assert torch.equal(torch.nan_to_num(y.float(), 9, 8, -8), torch.nan_to_num(ref.float(), 9, 8, -8))


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16, torch.int64))
def test_accumulate_repeated_indices(cache, dtype):
    g = torch.Generator().manual_seed(2)
    x = (torch.randn(6, 3, generator=g) * 4).to(dtype)
    idx = torch.tensor([1, 1, 5, -1, 0, 1, 3])
    vals = (torch.randn(7, 3, generator=g) * 100).to(dtype)
    y, _ = _run(ChipModel(cache_bytes=cache), x, [idx], vals, accumulate=True)
    ref = torch.ops.aten.index_put(x, [idx], vals, True)
    assert torch.equal(y, ref), (y, ref)


def test_accumulate_bool_is_or_and_last_write_wins():
    chip = ChipModel()
    x = torch.tensor([True, False, False])
    y, _ = _run(chip, x, [torch.tensor([1, 1, 0])], torch.tensor([True, False, False]), accumulate=True)
    assert torch.equal(y, torch.ops.aten.index_put(x, [torch.tensor([1, 1, 0])], torch.tensor([True, False, False]), True))
    y, _ = _run(chip, torch.zeros(3), [torch.tensor([2, 2, 2])], torch.tensor([1.0, 2.0, 3.0]))
    assert y.tolist() == [0.0, 0.0, 3.0]


def test_empty_index_and_refusals():
    chip = ChipModel()
    x = torch.randn(4, 2)
    y, _ = _run(chip, x, [torch.zeros(0, dtype=torch.long)], torch.zeros(0, 2))
    assert torch.equal(y, x)
    with pytest.raises(KernelError, match="out of range"):
        _run(chip, x, [torch.tensor([4])], torch.ones(1, 2))
    spec = get("index_put")
    with pytest.raises(KernelError, match="must have the dtype of x"):
        spec.problem({"x": (4,), "values": (2,), "i0": (2,)}, {}, "float32", {},
                     {"x": "float32", "values": "float16", "i0": "int64"})
    with pytest.raises(KernelError, match="cannot be broadcast"):
        spec.problem({"x": (4, 2), "values": (3,), "i0": (2,)}, {}, "float32", {},
                     {"x": "float32", "values": "float32", "i0": "int64"})
