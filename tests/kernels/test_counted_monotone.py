"""Executed (counted) off-chip bytes never grow with a bigger cache, kernel by kernel."""
import pytest
import torch

from torchfl.kernels import DeviceMemory
from torchfl.kernels.catalog import CATALOG

from .helpers import chip_for, dev

CACHES = (2 << 10, 8 << 10, 32 << 10, 128 << 10, 1 << 20, 8 << 20)

CASES = [
    ("matmul", lambda m: {"a": dev(torch.randn(70, 90), m), "b": dev(torch.randn(90, 50), m),
                          "bias": dev(torch.randn(50), m)}, {}),
    ("bmm", lambda m: {"a": dev(torch.randn(3, 40, 33), m), "b": dev(torch.randn(3, 33, 20), m)}, {}),
    ("attention", lambda m: {k: dev(torch.randn(1, 2, 70, 16), m) for k in "qkv"}, {"causal": True}),
    ("softmax", lambda m: {"x": dev(torch.randn(30, 700), m)}, {"dim": -1}),
    ("add", lambda m: {"a": dev(torch.randn(40, 300), m), "b": dev(torch.randn(300), m)}, {}),
    ("expand", lambda m: {"x": dev(torch.randn(1, 300), m)}, {"shape": (40, 300)}),
]


@pytest.mark.parametrize("name,make,attrs", CASES, ids=[c[0] for c in CASES])
def test_counted_bytes_non_increasing(name, make, attrs):
    last = None
    for c in CACHES:
        chip = chip_for("float32", c)
        ins = make(DeviceMemory(chip))
        try:
            _, counted = CATALOG[name].run(chip, ins, attrs)
        except Exception as e:
            assert last is None, f"{name}: cache {c} failed after a smaller cache worked: {e}"
            continue
        if last is not None:
            assert counted.bytes <= last, f"{name}: {c} B cache moved {counted.bytes} B > {last} B"
        last = counted.bytes
    assert last is not None
