"""Issue 48, 3c: a host fallback runs what CPU torch runs. transformers' MoE routing passes
``expert_ids.int()`` to ``torch.histc`` on every device but CPU and MPS (CUDA's histc counts
integers, CPU's refuses them): on ``npu:0`` the fallback handed the int tensor to CPU torch and
crashed, ``NotImplementedError: "histogram_cpu" not implemented for 'Int'``, where the same model
runs on CPU. The fallback counts integers exactly in float64 (every int32 is exact there) and
returns the input's dtype, as CUDA does."""
import pytest
import torch


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float32])
@pytest.mark.parametrize("lo,hi", [(0, 7), (0, 0), (2, 5)], ids=["range", "data-range", "clipped"])
def test_histc_of_integers_on_the_device(fp32_dev, dtype, lo, hi):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 8, (64,), generator=g, dtype=torch.int64).to(dtype)
    got = torch.histc(ids.to(fp32_dev), bins=8, min=lo, max=hi)
    ref = torch.histc(ids.double(), bins=8, min=lo, max=hi)
    assert got.dtype == dtype and got.device.type == "npu"
    assert torch.equal(got.cpu().double(), ref)


def test_histc_of_an_empty_int_tensor(fp32_dev):
    got = torch.histc(torch.empty(0, dtype=torch.int32, device=fp32_dev), bins=4, min=0, max=3)
    assert got.dtype == torch.int32 and got.cpu().tolist() == [0, 0, 0, 0]
