"""Layout and cast families vs torch; counted == predicted; every permutation."""
import itertools

import numpy as np
import pytest
import torch

from torchfl.kernels import DeviceMemory, KernelError
from torchfl.kernels.catalog import CATALOG

from .helpers import bytes_monotone, chip_for, dev, run_checked

PERMS4 = ["".join(p) for p in itertools.permutations("NCHW")]
ALL = ["float32", "float16", "bfloat16", "int8", "int32", "int64", "bool"]


def _rand(shape, dtype, g):
    x = torch.randn(*shape, generator=g) * 50
    if dtype == "bool":
        return x > 0
    if dtype in ("int8", "int32", "int64"):
        return x.clamp(-128, 127).to(getattr(torch, dtype))
    return x.to(getattr(torch, dtype))


@pytest.mark.parametrize("src", [None, "NHWC", "WCHN"])
@pytest.mark.parametrize("dst", PERMS4)
def test_layout_transform_any_to_any(src, dst):
    chip = chip_for("float32", 4 << 10)
    mem = DeviceMemory(chip)
    x = torch.randn(2, 3, 5, 7)
    t = dev(x, mem, layout=src)
    (y,), _ = run_checked("layout_transform", chip, {"x": t}, {"layout": dst})
    assert y.physical().shape == tuple(x.shape[i] for i in y.perm)
    assert torch.equal(y.to_torch(), x)


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("shape,layout", [((0, 3), "BA"), ((1,), None), ((3, 1, 4, 1), "HWNC"), ((17, 19, 3), "LNC")])
def test_copy_and_layout_all_dtypes(dtype, shape, layout):
    chip = chip_for("float32", 4 << 10)
    mem = DeviceMemory(chip)
    x = _rand(shape, dtype, torch.Generator().manual_seed(0))
    t = dev(x, mem, layout=layout)
    (y,), _ = run_checked("copy", chip, {"x": t})
    assert y.layout == t.layout and torch.equal(y.to_torch(), x)
    (z,), _ = run_checked("layout_transform", chip, {"x": t}, {"layout": None})
    assert z.layout is None and torch.equal(z.to_torch(), x)


def test_reshape_metadata_and_copy():
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    x = torch.randn(2, 3, 4, 5)
    t = dev(x, mem)
    (y,), plan = run_checked("reshape", chip, {"x": t}, {"shape": (6, -1)})
    assert plan.config.strategy == "metadata" and plan.traffic.bytes == 0
    assert y.buffer is t.buffer and torch.equal(y.to_torch(), x.reshape(6, -1))
    tn = dev(x, mem, layout="NHWC")
    (y2,), plan2 = run_checked("reshape", chip, {"x": tn}, {"shape": (2, 60)})
    assert plan2.traffic.bytes == 2 * x.numel() * 4
    assert torch.equal(y2.to_torch(), x.reshape(2, 60))
    with pytest.raises(KernelError, match="has 132 elements, the input"):
        CATALOG["reshape"].problem({"x": (11, 11)}, {"shape": (11, 12)})


@pytest.mark.parametrize("dim,start,end,step", [(0, 0, None, 1), (1, 1, 3, 1), (2, 0, 5, 2), (3, -3, None, 1), (2, 4, 2, 1)])
@pytest.mark.parametrize("layout", [None, "NHWC", "HWCN"])
def test_slice(dim, start, end, step, layout):
    chip = chip_for("float32", 4 << 10)
    mem = DeviceMemory(chip)
    x = torch.randn(2, 3, 5, 7)
    (y,), _ = run_checked("slice", chip, {"x": dev(x, mem, layout=layout)},
                          {"dim": dim, "start": start, "end": end, "step": step})
    idx = [slice(None)] * 4
    idx[dim] = slice(start, end, step)
    assert torch.equal(y.to_torch(), x[tuple(idx)])


@pytest.mark.parametrize("dim,sizes", [(0, [1, 1]), (1, [0, 2, 1]), (3, [3, 3, 1]), (-1, [7])])
@pytest.mark.parametrize("layout", [None, "NHWC"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int64"])
def test_split(dim, sizes, layout, dtype):
    chip = chip_for("float32", 1 << 10)   # 1 KiB: several tiles per output
    mem = DeviceMemory(chip)
    x = _rand((2, 3, 5, 7), dtype, torch.Generator().manual_seed(1))
    t = dev(x, mem, layout=layout)
    ys, plan = run_checked("split", chip, {"x": t}, {"dim": dim, "sizes": sizes})
    want = torch.split(x, sizes, dim)
    assert len(ys) == len(want)
    for y, w in zip(ys, want):   # each piece keeps the input's layout
        assert y.layout == t.layout and torch.equal(y.to_torch(), w)
    assert plan.traffic.bytes_written == x.numel() * x.element_size()


def test_split_sizes_must_cover_the_dim():
    with pytest.raises(KernelError, match=r"sizes \[2, 2\] must be non-negative and add up to 5"):
        CATALOG["split"].problem({"x": (3, 5)}, {"dim": 1, "sizes": [2, 2]})


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("layouts", [(None, None, None), ("NHWC", None, "HWCN")])
def test_concat(dim, layouts):
    chip = chip_for("float16", 4 << 10)
    mem = DeviceMemory(chip)
    shapes = [[2, 3, 4, 5] for _ in range(3)]
    for i, s in enumerate(shapes):
        s[dim] += i
    xs = [torch.randn(*s).half() for s in shapes]
    ins = {f"x{i}": dev(x, mem, layout=lay) for i, (x, lay) in enumerate(zip(xs, layouts))}
    (y,), _ = run_checked("concat", chip, ins, {"dim": dim})
    assert torch.equal(y.to_torch(), torch.cat(xs, dim))


@pytest.mark.parametrize("cache", (1 << 10, 8 << 20))
def test_expand(cache):
    chip = chip_for("float32", cache)
    mem = DeviceMemory(chip)
    x = torch.randn(3, 1, 5)
    (y,), plan = run_checked("expand", chip, {"x": dev(x, mem)}, {"shape": (2, 3, 4, -1)})
    assert torch.equal(y.to_torch(), x.expand(2, 3, 4, 5))


@pytest.mark.parametrize("src", ALL)
@pytest.mark.parametrize("to", ALL)
def test_cast_matches_torch(src, to):
    chip = chip_for("float32", 4 << 10)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(3)
    x = _rand((7, 33), src, g)
    if src in ("float32", "float16", "bfloat16") and to in ("int8", "int32", "int64"):
        x = x.clamp(-100, 100)   # torch's float -> int is undefined out of range
    (y,), _ = run_checked("cast", chip, {"x": dev(x, mem, layout="BA")}, {"to": to})
    ref = x.to(getattr(torch, to))
    got = y.to_torch()
    assert got.dtype == ref.dtype and torch.equal(got, ref), (src, to)


def test_cast_specials_and_quantize():
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    x = torch.tensor([0.0, -0.0, 1e-8, 65504.0, 65520.0, 1e6, float("inf"), float("-inf"), float("nan"), 3.14159])
    for to in ("float16", "bfloat16"):
        (y,), _ = run_checked("cast", chip, {"x": dev(x, mem)}, {"to": to})
        torch.testing.assert_close(y.to_torch(), x.to(getattr(torch, to)), rtol=0, atol=0, equal_nan=True)
    q = torch.randn(100) * 3
    (y,), _ = run_checked("cast", chip, {"x": dev(q, mem)}, {"to": "int8", "quantize": True, "scale": 0.05, "zero_point": 4})
    ref = torch.quantize_per_tensor(q, 0.05, 4, torch.qint8).int_repr()
    assert torch.equal(y.to_torch(), ref)
    (z,), _ = run_checked("cast", chip, {"x": y}, {"to": "float32", "quantize": True, "scale": 0.05, "zero_point": 4})
    torch.testing.assert_close(z.to_torch(), torch.dequantize(torch.quantize_per_tensor(q, 0.05, 4, torch.qint8)))


@pytest.mark.parametrize("name,shapes,attrs", [("layout_transform", {"x": (8, 64, 32, 32)}, {"layout": "NHWC"}),
                                               ("expand", {"x": (1, 64, 1)}, {"shape": (32, 64, 100)}),
                                               ("cast", {"x": (1000, 100)}, {"to": "float16"})])
def test_bigger_cache_never_more_bytes(name, shapes, attrs):
    bytes_monotone(name, shapes, attrs, "float32")


@pytest.mark.parametrize("where", [0, 1, 2])
def test_concat_skips_legacy_empty_1d_inputs_as_torch_does(where):
    """torch.cat ignores 1-D empty tensors beside tensors of any rank (Hugging Face's
    DynamicCache starts from ``torch.tensor([])``): shape [0] is not checked against the others."""
    chip = chip_for("float16", 4 << 10)
    mem = DeviceMemory(chip)
    xs = [torch.randn(2, 4, 3, 8).half(), torch.randn(2, 4, 5, 8).half()]
    xs.insert(where, torch.empty(0).half())
    ins = {f"x{i}": dev(x, mem) for i, x in enumerate(xs)}
    (y,), _ = run_checked("concat", chip, ins, {"dim": -2})
    assert torch.equal(y.to_torch(), torch.cat(xs, -2))
    # every input empty and 1-D: an empty 1-D result, as torch
    ins = {"x0": dev(torch.empty(0).half(), mem), "x1": dev(torch.empty(0).half(), mem)}
    (y,), _ = run_checked("concat", chip, ins, {"dim": 0})
    assert tuple(y.shape) == (0,)
    with pytest.raises(KernelError, match="does not match"):
        CATALOG["concat"].problem({"x0": (2, 3), "x1": (0, 4)}, {"dim": 0}, "float16")
