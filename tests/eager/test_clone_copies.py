"""The eager device's clones still copy (planner/elide.py elides clones only in graphs compiled
whole): ``y = x.clone(); x.add_(1)`` must leave ``y`` as it was, op by op and in lazy mode,
on TFL-X1 (float32, exact: a copy and an add of 1).

Lazy mode is entered with ``torch.npu.lazy()``, not ``TORCHFL_LAZY``: that variable is read once
per thread, at its first op, for the whole process; set by this test (monkeypatch) when it ran
first in an xdist worker, it left every later test of the worker in lazy mode (11 eager tests
failed in a CI run: strict, debug log, dtype errors, RNG)."""
import contextlib

import pytest
import torch


@pytest.mark.parametrize("lazy", [False, True])
def test_clone_then_write_to_the_input_on_the_device(fp32_dev, lazy):
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    with torch.npu.lazy() if lazy else contextlib.nullcontext():
        x = base.to(fp32_dev)
        y = x.clone()
        x.add_(1)
        z = x.clone()
        z.mul_(2)
    assert torch.equal(y.cpu(), base)
    assert torch.equal(x.cpu(), base + 1)
    assert torch.equal(z.cpu(), (base + 1) * 2)
