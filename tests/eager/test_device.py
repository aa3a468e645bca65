"""The npu device itself: chips per index, factories, copies, printing, views, memory
statistics, out-of-memory, layouts, strict mode and the debug log."""
import logging

import pytest
import torch

from torchfl.kernels.tensor import logical_letters


def _granule(nbytes: int, alignment: int) -> int:
    return 0 if nbytes == 0 else max(alignment, -(-nbytes // alignment) * alignment)


def test_one_index_per_chip(fp32_dev, fp16_dev):
    assert torch.npu.device_count() >= 2
    assert torch.npu.get_device_name(torch.device(fp32_dev).index) == "TFL-X1"
    assert torch.npu.get_device_name(torch.device(fp16_dev).index) == "NPU-V3"
    assert torch.npu.is_available()
    assert torch.accelerator.current_accelerator().type == "npu"
    with torch.npu.device(fp16_dev):
        assert torch.npu.current_device() == torch.device(fp16_dev).index
        assert torch.empty(3).to("npu").device == torch.device(fp16_dev)
    with pytest.raises(ValueError, match="does not exist"):
        torch.npu.get_device_name(99)


def test_factories_copies_printing_views(fp32_dev):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    d = x.to(fp32_dev)
    assert d.device == torch.device(fp32_dev) and d.is_npu
    torch.testing.assert_close(d.cpu(), x, rtol=0, atol=0)
    assert d.data_ptr() % 256 == 0                       # TFL-X1's memory_alignment_bytes
    z = torch.zeros(2, 5, device=fp32_dev)
    o = torch.ones(2, 5, device=fp32_dev, dtype=torch.float16)
    assert z.cpu().abs().sum() == 0 and o.cpu().dtype == torch.float16 and bool((o.cpu() == 1).all())
    assert "device='npu:" in repr(d) and "11." in repr(d)
    v = d.t()                                            # a view: same buffer, no copy
    assert v.data_ptr() == d.data_ptr()
    torch.testing.assert_close(v.cpu(), x.t(), rtol=0, atol=0)
    s = d[1:, ::2]
    torch.testing.assert_close(s.cpu(), x[1:, ::2], rtol=0, atol=0)
    torch.testing.assert_close(d.view(-1).cpu(), x.view(-1), rtol=0, atol=0)
    assert d[2, 3].item() == 11.0
    # an op on a strided, offset view (copied to an aligned buffer first): still exact
    torch.testing.assert_close((s + s).cpu(), x[1:, ::2] * 2, rtol=0, atol=0)
    empty = torch.empty(0, 4, device=fp32_dev)
    assert empty.cpu().shape == (0, 4)
    # module.to and Tensor.npu()
    lin = torch.nn.Linear(4, 2).to(fp32_dev)
    assert lin.weight.device == torch.device(fp32_dev)
    assert x.npu(torch.device(fp32_dev).index).device == torch.device(fp32_dev)


def test_nan_inf_and_mixed_devices(fp32_dev, fp16_dev):
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0])
    got = torch.relu(x.to(fp32_dev)).cpu()
    torch.testing.assert_close(got, torch.relu(x), rtol=0, atol=0, equal_nan=True)
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(3, device=fp32_dev) + torch.ones(3, device=fp16_dev, dtype=torch.float16)


def test_memory_statistics_are_exact(small_dev):
    index = torch.device(small_dev).index
    torch.npu.empty_cache()
    base = torch.npu.memory_allocated(index)
    align = torch.npu.get_device_properties(index).alignment
    sizes = [(3,), (100, 7), (1, 3, 5, 5), (0,)]
    tensors = [torch.empty(s, device=small_dev) for s in sizes]
    expect = sum(_granule(t.untyped_storage().nbytes(), align) for t in tensors)
    assert torch.npu.memory_allocated(index) - base == expect
    for t in tensors:
        assert t.data_ptr() % align == 0 or t.numel() == 0
    torch.npu.reset_peak_memory_stats(index)
    peak0 = torch.npu.max_memory_allocated(index)
    big = torch.empty(1 << 20, device=small_dev)
    assert torch.npu.max_memory_allocated(index) == peak0 + (1 << 22)
    del big
    assert torch.npu.memory_allocated(index) - base == expect
    assert torch.npu.memory_reserved(index) >= torch.npu.memory_allocated(index) + (1 << 22)  # cached block
    torch.npu.empty_cache()
    assert torch.npu.memory_reserved(index) == torch.npu.memory_allocated(index)
    del tensors
    assert torch.npu.memory_allocated(index) == base


def test_out_of_memory_names_the_chip(small_dev):
    index = torch.device(small_dev).index
    before = torch.npu.memory_allocated(index)
    with pytest.raises(torch.OutOfMemoryError, match=r"out of memory on EDGE-C2.*free of 1\.00 GiB"):
        torch.empty(300 << 20, device=small_dev)        # 1.17 GiB of float32 on a 1 GiB chip
    assert torch.npu.memory_allocated(index) == before
    keep = torch.empty(200 << 20, device=small_dev, dtype=torch.uint8)
    with pytest.raises(torch.OutOfMemoryError, match="EDGE-C2"):
        torch.empty(900 << 20, device=small_dev, dtype=torch.uint8)
    del keep


def test_default_layout_and_layout_errors(fp16_dev, small_dev):
    # NPU-V3's default_layout is NHCW: a 4-D tensor created there is stored NHCW ...
    x = torch.randn(1, 3, 4, 5, device=fp16_dev, dtype=torch.float16)
    from torchfl.planner.constraints import tensor_layout

    assert tensor_layout(x) == "NHCW"
    host = x.cpu()
    # ... unless the user asks for another one
    c = torch.empty(1, 3, 4, 5, device=fp16_dev, dtype=torch.float16, memory_format=torch.contiguous_format)
    assert c.is_contiguous()
    # an op reads the NHCW tensor in place and matches the host computation
    torch.testing.assert_close(torch.relu(x).cpu(), torch.relu(host), rtol=0, atol=0)
    # EDGE-C2 computes in NCWH and NCHW only. torch.compile refuses a channels-last input with
    # the article's error (tests/planner); on the device a tensor's strides are storage, not a
    # chip layout (issue 33): the op reads it through a counted conversion
    from torchfl.runtime.eager import ops

    cl = torch.randn(1, 3, 4, 5).to(small_dev, memory_format=torch.channels_last).half()
    before = ops.STATS["converted_inputs"]
    torch.testing.assert_close(torch.relu(cl).cpu(), torch.relu(cl.cpu()), rtol=0, atol=0)
    assert ops.STATS["converted_inputs"] == before + 1
    assert logical_letters(4) == "NCHW"


def test_strict_refuses_host_fallbacks(fp32_dev, monkeypatch):
    x = torch.randn(4, 4, device=fp32_dev)
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    with pytest.raises(RuntimeError, match="strict"):
        torch.flip(x, [0])                               # no rule maps flip
    torch.testing.assert_close((x * 2).cpu(), x.cpu() * 2)   # planned ops still run
    monkeypatch.delenv("TORCHFL_STRICT")
    from torchfl.runtime.eager import ops

    before = ops.STATS["host_fallback_ops"]
    torch.testing.assert_close(torch.flip(x, [0]).cpu(), torch.flip(x.cpu(), [0]))
    assert ops.STATS["host_fallback_ops"] == before + 1


def test_debug_log_prints_each_mapping(fp32_dev, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_FL_DEBUG", "1")
    x = torch.randn(3, 7, device=fp32_dev)             # a shape no other test plans
    with caplog.at_level(logging.DEBUG, logger="torchfl"):
        torch.sigmoid(x)
    assert any(r.getMessage().startswith("[SME] Mapping aten::sigmoid -> sigmoid") for r in caplog.records)


def test_precision_policy_and_dtype_errors(fp16_dev, monkeypatch):
    x = torch.randn(8, 8)
    d = x.to(fp16_dev)                                   # float32 tensor on a float16-only chip
    with pytest.raises(Exception, match="float16"):
        torch.mm(d, d)
    monkeypatch.setenv("TORCHFL_PRECISION", "float16")
    got = torch.mm(d, d).cpu()
    assert got.dtype == torch.float32
    # float16 storage and products, float32 accumulation: 2^-10 relative per rounded operand
    torch.testing.assert_close(got, x @ x, rtol=2e-2, atol=2e-2)
