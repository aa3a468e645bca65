"""Shared infrastructure: catalog import hygiene, chip from HCD, memory, tensors, codecs."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from torchfl.kernels import (AlignmentError, ChipModel, DeviceMemory, DeviceOOMError, DeviceTensor,
                             Traffic, simulated_time)
from torchfl.kernels.tiling import stream_plan

ROOT = Path(__file__).resolve().parents[2]


def test_catalog_imports_without_numba_or_torch():
    code = ("import sys, torchfl.kernels.catalog as c; "
            "assert c.CATALOG, 'empty catalog'; "
            "bad=[m for m in ('numba','torch') if m in sys.modules]; "
            "print(len(c.CATALOG)); assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr


def test_chip_from_hcd():
    from torchfl.hcd import load_hcd

    hcd = load_hcd(ROOT / "hcd_registry" / "npu_v3.hcd")
    chip = ChipModel.from_hcd(hcd)
    assert chip.cache_bytes == 8192 * 1024
    assert chip.offchip_bw == 128e9 and chip.cache_bw == 256e9
    assert chip.alignment == 256
    assert chip.peak["float16"] == pytest.approx(25.6e12)
    assert chip.peak["int8"] == pytest.approx(51.2e12)
    assert chip.units["float16"] == 256


def test_alloc_aligned_and_accounted():
    chip = ChipModel(alignment=4096, memory_bytes=1 << 20)
    m = DeviceMemory(chip)
    bufs = [m.alloc(n) for n in (1, 100, 4096, 5000, 0)]
    for b in bufs:
        assert b.address % 4096 == 0
    assert m.memory_allocated() == 4096 * (1 + 1 + 1 + 2 + 1)
    for b in bufs:
        b.free()
    assert m.memory_allocated() == 0
    assert m.max_memory_allocated() == 4096 * 6
    m.reset_peak_memory_stats()
    assert m.max_memory_allocated() == 0


def test_alloc_free_loop_no_growth():
    m = DeviceMemory(ChipModel(memory_bytes=64 << 20))
    for _ in range(500):
        b = m.alloc(1 << 20)
        b.free()
    assert m.memory_allocated() == 0 and m.max_memory_allocated() == 1 << 20


def test_oom_message_names_request_free_and_peak():
    m = DeviceMemory(ChipModel(memory_bytes=1 << 20))
    keep = m.alloc(600 << 10)
    with pytest.raises(DeviceOOMError) as e:
        m.alloc(600 << 10)
    msg = str(e.value)
    assert "tried to allocate 600.00 KiB" in msg and "424.00 KiB" in msg and "free" in msg and "peak" in msg
    keep.free()


def test_double_free_is_an_error():
    m = DeviceMemory(ChipModel())
    b = m.alloc(10)
    b.free()
    with pytest.raises(ValueError, match="double free"):
        b.free()


def test_kernel_refuses_misaligned_pointer():
    from torchfl.kernels.catalog import CATALOG

    chip = ChipModel()
    m = DeviceMemory(chip)
    a = DeviceTensor.from_numpy(np.ones((4, 4), np.float32), m)
    bad = DeviceTensor(m.alloc(4 * 4 * 4 + 64), (4, 4), None, "float32", offset=4)
    with pytest.raises(AlignmentError) as e:
        CATALOG["matmul"].run(chip, {"a": a, "b": bad})
    msg = str(e.value)
    assert f"0x{bad.address:x}" in msg and "misaligned by 4 bytes" in msg and "256-byte" in msg


@pytest.mark.parametrize("layout", [None, "NHWC", "NHCW", "NCWH", "WHCN"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int8", "int32", "bool"])
def test_tensor_roundtrip(layout, dtype, rng):
    import torch

    m = DeviceMemory(ChipModel())
    x = rng.standard_normal((2, 3, 5, 7)).astype(np.float32) * 4
    tx = torch.from_numpy(x).to(getattr(torch, dtype))
    t = DeviceTensor.from_torch(tx, m, layout=layout)
    assert t.physical().shape == tuple(tx.shape[p] for p in t.perm)
    back = t.to_torch()
    assert back.dtype == tx.dtype and torch.equal(back, tx)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "int64", "bool"])
def test_zero_dim_tensor_keeps_its_shape(dtype):
    """A 0-d tensor (BatchNorm's num_batches_tracked) comes back 0-d, not shape [1]: AOT
    autograd copies a mutated buffer back with its own shape."""
    import torch

    m = DeviceMemory(ChipModel())
    x = torch.tensor(3).to(getattr(torch, dtype))
    t = DeviceTensor.from_torch(x, m)
    assert t.shape == () and t.to_torch().shape == () and torch.equal(t.to_torch(), x)
    assert t.to_numpy().shape == ()


def test_codecs_match_torch_bits(rng):
    import torch
    from numba import njit

    from torchfl.kernels import codecs as C

    @njit
    def enc(a, code):
        out = np.empty(a.size, np.uint16)
        for i in range(a.size):
            out[i] = C.encode16(code, a[i])
        return out

    x = np.concatenate([rng.standard_normal(20000).astype(np.float32) * 1000,
                        rng.standard_normal(2000).astype(np.float32) * 1e-5,
                        np.array([0, -0.0, 65504, 65520, 1e6, np.inf, -np.inf, 6e-8, 3e-8], np.float32)])
    tx = torch.from_numpy(x)
    assert np.array_equal(enc(x, C.F16), tx.half().numpy().view(np.uint16))
    assert np.array_equal(enc(x, C.BF16), tx.bfloat16().view(torch.int16).numpy().view(np.uint16))


def test_f16c_codecs_match_the_software_ones(rng):
    """h2f_cvt / f2h_cvt (the CPU's conversions where it has F16C) give the software codecs'
    bits on every float16 pattern and on float32 values around every float16 rounding
    boundary (ties, overflow to inf, subnormals); NaN stays NaN of the same sign."""
    from numba import njit

    from torchfl.kernels import codecs as C

    @njit
    def both(h, x):
        d = np.empty((2, h.size), np.float32)
        e = np.empty((2, x.size), np.uint16)
        for i in range(h.size):
            d[0, i] = C.h2f(h[i])
            d[1, i] = C.h2f_cvt(h[i])
        for i in range(x.size):
            e[0, i] = C.f32_to_f16(x[i])
            e[1, i] = C.f2h_cvt(x[i])
        return d, e

    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    edges = h.view(np.float16).astype(np.float32).view(np.uint32)     # each float16 as float32
    near = (edges[:, None].astype(np.int64) + np.arange(-2, 3)[None, :] * (1 << 12)) % (1 << 32)   # +- half ulp
    near = near.reshape(-1).astype(np.uint32)
    x = np.concatenate([near.view(np.float32), rng.standard_normal(20000).astype(np.float32) * 1e3,
                        np.array([65504, 65519.99, 65520, 1e6, np.inf, -np.inf, 3e-8, 2.98e-8], np.float32)])
    d, e = both(h, x)
    nan_h = (h & 0x7C00) == 0x7C00
    nan_h &= (h & 0x3FF) != 0
    assert np.array_equal(d[0][~nan_h].view(np.uint32), d[1][~nan_h].view(np.uint32))
    assert np.isnan(d[1][nan_h]).all() and np.array_equal(np.signbit(d[1][nan_h]), np.signbit(d[0][nan_h]))
    fin = ~np.isnan(x)
    assert np.array_equal(e[0][fin], e[1][fin])
    nan16 = lambda b: ((b & 0x7C00) == 0x7C00) & ((b & 0x3FF) != 0)   # noqa: E731
    assert nan16(e[1][~fin]).all() and np.array_equal(e[1][~fin] >> 15, e[0][~fin] >> 15)


def test_simulated_time_is_roofline_per_tile():
    chip = ChipModel(peak={"float32": 1e12}, offchip_bw=1e9)
    # one tile, 1 ms of compute and 2 ms of memory: nothing overlaps its own load
    assert simulated_time(Traffic(1_000_000, 1_000_000, 10**9), chip, "float32") == pytest.approx(3e-3)
    plan = stream_plan("x", (), 1000, 4000, 4000, 10, chip.with_cache(1 << 20))
    assert plan.config.strategy == "streamed"
    # double-buffered: the larger term per tile, plus the pipeline's fill/drain (the mean tile's smaller term)
    comp = sum(c * t.flops / 1e12 for c, t in plan.groups)
    mem = sum(c * t.bytes / 1e9 for c, t in plan.groups)
    expect = sum(c * max(t.flops / 1e12, t.bytes / 1e9) for c, t in plan.groups) + min(comp, mem) / plan.n_tiles
    assert simulated_time(plan, chip, "float32") == pytest.approx(expect)
    assert plan.traffic == Traffic(4_000_000, 4_000_000, 10_000)
