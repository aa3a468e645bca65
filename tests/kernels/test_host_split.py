"""The host's split of large elementwise, layout and layer-norm calls over threads (issue 38):
the same bits and the same counted traffic as the one-thread paths, at 1, 2 and 3 threads,
with the plan's tiles many (small cache) or one (the tensor resident)."""
import numpy as np
import pytest
import torch
from numba import get_num_threads, set_num_threads

import torchfl.kernels.elementwise.split as ew_split
import torchfl.kernels.layout.split as lay_split
import torchfl.kernels.threads as threads
from torchfl.kernels import DeviceMemory
from torchfl.kernels.catalog import CATALOG

from .helpers import as_f32, assert_close, chip_for, dev, run_checked

THREADS = [n for n in (1, 2, 3) if n <= max(get_num_threads(), 1)] or [1]


@pytest.fixture(autouse=True)
def always_parallel(monkeypatch):
    """Small test tensors take the parallel paths with every thread (as large ones do)."""
    monkeypatch.setattr(threads, "SMALL_FLOPS", 0)


def _bits(t):
    return t.physical().reshape(-1).view(np.uint8).copy()


def _run(name, chip, inputs, attrs, nthreads):
    n0 = get_num_threads()
    set_num_threads(nthreads)
    try:
        outs, plan = run_checked(name, chip, inputs, attrs)
    finally:
        set_num_threads(n0)
    return outs, plan


def _both(monkeypatch, name, chip, inputs, attrs=None):
    """(tile-loop outputs, [split outputs at each thread count]); counted == predicted in each."""
    for m in (ew_split, lay_split):
        monkeypatch.setattr(m, "PAR_BYTES", 1 << 62)
    ref, _ = _run(name, chip, inputs, attrs, 1)
    for m in (ew_split, lay_split):
        monkeypatch.setattr(m, "PAR_BYTES", 0)
    return ref, [_run(name, chip, inputs, attrs, n)[0] for n in THREADS]


EW = [("add", {"alpha": 0.5}, 2), ("mul", {}, 2), ("gelu", {"approximate": "tanh"}, 1), ("relu", {}, 1),
      ("gelu_backward", {}, 2), ("sub", {"scalar": 1.5}, 1), ("div", {}, 2), ("maximum", {}, 2)]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "bfloat16_emulated"])
@pytest.mark.parametrize("name,attrs,arity", EW)
@pytest.mark.parametrize("cache", (4 << 10, 8 << 20))
def test_elementwise_split_is_the_tile_loop(monkeypatch, dtype, name, attrs, arity, cache):
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(3)
    names = {"gelu_backward": ("grad", "x")}.get(name, ("a", "b"))
    inputs = {names[0]: dev(torch.randn(3, 7, 11, 13, generator=g), mem, dtype, "NHWC")}
    if arity == 2:     # the second operand strided (another layout) in one case, broadcast in the other
        shape, lay = ((3, 7, 11, 13), "NCHW") if name != "mul" else ((7, 1, 13), None)
        inputs[names[1]] = dev(torch.randn(*shape, generator=g).abs() + 0.5, mem, dtype, lay)
    ref, got = _both(monkeypatch, name, chip, inputs, attrs)
    for outs in got:
        assert outs[0].layout == ref[0].layout
        assert np.array_equal(_bits(outs[0]), _bits(ref[0])), f"{name} {dtype}: the split changed bits"


def test_elementwise_split_against_torch(monkeypatch):
    """Not just equal to the old loop: right (fp16 add of a 512 x 768 residual, BERT's shape)."""
    monkeypatch.setattr(ew_split, "PAR_BYTES", 0)
    chip = chip_for("float16", 8 << 20)
    mem = DeviceMemory(chip)
    a, b = torch.randn(1, 512, 768), torch.randn(1, 512, 768)
    (y,), _ = _run("add", chip, {"a": dev(a, mem, "float16"), "b": dev(b, mem, "float16")}, None, THREADS[-1])
    assert_close(as_f32(y), a.half().float() + b.half().float(), "float16")


def test_small_calls_keep_the_tile_loop(monkeypatch):
    """Under PAR_BYTES no region is entered (eager's small ops pay no wake-up)."""
    calls = []
    real = ew_split._parts
    monkeypatch.setattr(ew_split, "_parts", lambda *a: calls.append(1) or real(*a))
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    x = dev(torch.randn(64, 64), mem)                 # 16 KB
    run_checked("relu", chip, {"a": x})
    assert not calls
    x = dev(torch.randn(128, 128), mem)               # 64 KB
    run_checked("relu", chip, {"a": x})
    assert calls == [1]


LAYOUT = [("layout_transform", {"layout": "NHWC"}, (3, 7, 11, 13), "NCHW"),
          ("layout_transform", {"layout": [0, 2, 1, 3]}, (1, 37, 12, 64), None),     # BERT's head split
          ("copy", {"out_layout": None}, (3, 7, 11, 13), None),                       # contiguous walk
          ("copy", {"out_layout": "WCNH"}, (3, 7, 11, 13), "NHWC"),
          ("expand", {"shape": (5, 7, 11, 13)}, (7, 1, 13), None),
          ("expand", {"shape": (2, 300, 7, 97)}, (300, 1, 97), None),                  # not resident in 4 KB
          ("slice", {"dim": 2, "start": 1, "end": 10, "step": 3}, (3, 7, 11, 13), "NHWC"),
          ("split", {"dim": 1, "sizes": (2, 5)}, (3, 7, 11, 13), "NHWC"),
          ("reshape", {"shape": (21, -1)}, (3, 7, 11, 13), "NHWC")]


@pytest.mark.parametrize("dtype", ["float32", "float16", "int64", "bool"])
@pytest.mark.parametrize("name,attrs,shape,layout", LAYOUT)
@pytest.mark.parametrize("cache", (4 << 10, 8 << 20))
def test_layout_split_is_the_tile_loop(monkeypatch, dtype, name, attrs, shape, layout, cache):
    chip = chip_for("float32", cache)
    mem = DeviceMemory(chip)
    x = torch.randint(0, 2 if dtype == "bool" else 1000, shape, generator=torch.Generator().manual_seed(5))
    x = x.bool() if dtype == "bool" else x.to(getattr(torch, dtype))
    xd = dev(x, mem, None, layout)
    ref, got = _both(monkeypatch, name, chip, {"x": xd}, attrs)
    for outs in got:
        assert len(outs) == len(ref)
        for o, r in zip(outs, ref):
            assert np.array_equal(_bits(o), _bits(r)), f"{name} {dtype}: the split changed bits"
    if name == "layout_transform" and dtype == "float32":
        assert torch.equal(as_f32(got[-1][0]), x)      # the logical values are the input's


def test_each_op_task_has_a_symbol_of_its_own():
    """The split calls an op's apply through its address, looked up by symbol: every op's ``apply``
    is named ``apply`` and ops compiled in other processes can share a symbol (relu ran add's code
    after test_elementwise.py loaded add's from the cache); the split's task of each op may not."""
    from numba import typeof

    from torchfl.kernels.elementwise.impl import apply_task

    sig = tuple(typeof(a) for a in (ew_split._F, ew_split._F, ew_split._F, ew_split._B, ew_split._F,
                                    np.float32(0), np.float32(0), True, False))
    names = set()
    for op in (0, 2, 4, 5):     # add, mul, relu, gelu
        fn = apply_task(op)
        fn.compile(sig)
        names.add(fn.overloads[sig].fndesc.llvm_func_name)
    assert len(names) == 4
