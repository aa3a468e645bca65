"""index family (index.Tensor, gather, index_select, as_strided) vs torch; counted == predicted."""
import pytest
import torch

from torchfl.kernels import ChipModel, DeviceMemory, KernelError

from .helpers import as_f32, dev, run_checked

CACHES = (1 << 20, 64)   # resident, and a cache that forces small streamed tiles


def _nan_inf(x):
    x = x.clone()
    x.view(-1)[0], x.view(-1)[-1] = float("nan"), float("-inf")
    return x


@pytest.mark.parametrize("cache", CACHES)
def test_index_padding_mask_lookup(cache):
    """mask[batch_idx, kv_idx] as Hugging Face builds it: a bool x, two broadcast index tensors."""
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    m = torch.rand(2, 16) > 0.3
    b, kv = torch.arange(2).view(2, 1, 1, 1), torch.arange(16).view(1, 1, 1, 16)
    (y,), _ = run_checked("index", chip, {"x": dev(m, mem), "i0": dev(b, mem), "i1": dev(kv, mem)})
    assert torch.equal(y.to_torch(), m[b, kv])


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dims", [(1,), (0, 2), (1, 2), (3,), (0,)])
def test_index_any_dims_negative_and_layout(dims, cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = _nan_inf(torch.randn(4, 5, 6, 3))
    ids = {0: torch.tensor([[0, -1], [2, 1]]), 1: torch.tensor([4, -5]), 2: torch.tensor([[1], [5]]),
           3: torch.tensor([2, 0, 2])}
    full = [slice(None)] * 4
    for d in dims:
        full[d] = ids[d]
    (y,), _ = run_checked("index", chip, {"x": dev(x, mem, layout="NHWC"),
                                          **{f"i{d}": dev(ids[d], mem) for d in dims}})
    torch.testing.assert_close(y.to_torch(), x[tuple(full)], equal_nan=True, rtol=0, atol=0)


def test_index_half_int32_and_empty():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(3, 4).half()
    i = torch.tensor([2, 0], dtype=torch.int32)
    (y,), _ = run_checked("index", chip, {"x": dev(x, mem, "float16"), "i0": dev(i, mem)})
    assert torch.equal(as_f32(y), x[i.long()].float())
    (y,), _ = run_checked("index", chip, {"x": dev(x, mem, "float16"), "i1": dev(torch.zeros(0, dtype=torch.long), mem)})
    assert y.shape == (3, 0)


def test_index_out_of_range_names_the_index():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.randn(3, 4)
    with pytest.raises(KernelError, match=r"index 3 of i0 .* size 3"):
        run_checked("index", chip, {"x": dev(x, mem), "i0": dev(torch.tensor([0, 3]), mem)})
    with pytest.raises(KernelError, match="bool mask"):
        run_checked("index", chip, {"x": dev(x, mem), "i0": dev(torch.tensor([True, False, True]), mem)})


@pytest.mark.parametrize("cache", CACHES)
def test_gather_and_index_select(cache):
    chip = ChipModel(cache_bytes=cache)
    mem = DeviceMemory(chip)
    x = _nan_inf(torch.randn(4, 5, 6))
    idx = torch.randint(0, 5, (3, 4, 6))
    (y,), _ = run_checked("gather", chip, {"x": dev(x, mem, layout=(2, 0, 1)), "index": dev(idx, mem)}, {"dim": 1})
    torch.testing.assert_close(y.to_torch(), torch.gather(x, 1, idx), equal_nan=True, rtol=0, atol=0)
    j = torch.tensor([5, 0, 0, 3])
    (y,), _ = run_checked("index_select", chip, {"x": dev(x, mem, "bfloat16"), "index": dev(j, mem)}, {"dim": -1})
    torch.testing.assert_close(as_f32(y), torch.index_select(x.bfloat16(), -1, j).float(), equal_nan=True,
                               rtol=0, atol=0)
    with pytest.raises(KernelError, match="index -1 of index"):
        run_checked("gather", chip, {"x": dev(x, mem), "index": dev(idx[:1] * 0 - 1, mem)}, {"dim": 1})


def test_gather_roberta_positions_from_expanded_table():
    """RoBERTa's token-type lookup: gather from an expanded (stride 0) table, int64."""
    chip = ChipModel()
    mem = DeviceMemory(chip)
    table = torch.arange(128).expand(2, 128)
    idx = torch.randint(0, 128, (2, 16))
    (y,), _ = run_checked("gather", chip, {"x": dev(table.contiguous(), mem), "index": dev(idx, mem)}, {"dim": 1})
    assert torch.equal(y.to_torch(), torch.gather(table, 1, idx))


@pytest.mark.parametrize("size,stride,off", [((3, 4), (5, 2), 7), ((2, 64, 1, 1), (64, 1, 64, 64), 0), ((0, 2), (1, 1), 0)])
def test_as_strided(size, stride, off):
    chip = ChipModel(cache_bytes=256)
    mem = DeviceMemory(chip)
    x = _nan_inf(torch.randn(2, 64, 1, 1))
    (y,), _ = run_checked("as_strided", chip, {"x": dev(x, mem)}, {"size": size, "stride": stride, "storage_offset": off})
    torch.testing.assert_close(y.to_torch(), torch.as_strided(x, size, stride, off), equal_nan=True, rtol=0, atol=0)


def test_as_strided_window_past_the_end_is_refused():
    with pytest.raises(KernelError, match="reaches element 128"):
        from torchfl.kernels.catalog import get
        get("as_strided").problem({"x": (2, 64)}, {"size": (2, 2), "stride": (64, 64), "storage_offset": 0})


def test_gather_and_index_select_of_a_0d_tensor():
    chip = ChipModel()
    mem = DeviceMemory(chip)
    x = torch.tensor(2.5)
    (y,), _ = run_checked("index_select", chip, {"x": dev(x, mem), "index": dev(torch.tensor([0]), mem)}, {"dim": 0})
    assert y.shape == () and torch.equal(y.to_torch(), torch.index_select(x, 0, torch.tensor([0])))
    (y,), _ = run_checked("gather", chip, {"x": dev(x, mem), "index": dev(torch.tensor(0), mem)}, {"dim": 0})
    assert torch.equal(y.to_torch(), torch.gather(x, 0, torch.tensor(0)))
    with pytest.raises(KernelError, match="index 1 of index"):
        run_checked("gather", chip, {"x": dev(x, mem), "index": dev(torch.tensor(1), mem)}, {"dim": 0})
