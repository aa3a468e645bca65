"""Max pooling computes indices only where something reads them: core ATen turns every
``max_pool2d`` into ``max_pool2d_with_indices``; capture gives the values-only form back
when the indices are unread (inference), and keeps them when the model returns them."""
import torch

from tests.runtime.models import rel_err, seeded
from torchfl.planner import plan_module

V3 = {"chip": "NPU-V3", "precision": "float16"}
FP16_TOL = 1e-2   # fp16 storage with fp32 accumulation, relative to max |ref|


class PoolLast(torch.nn.Module):
    """The pool's values are the graph's output (the renamed-output path)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.pool = torch.nn.MaxPool2d(3, 2, 1)

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x)))


class PoolThenConv(PoolLast):
    def __init__(self):
        super().__init__()
        self.conv2 = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.conv2(super().forward(x))


class PoolWithIndices(torch.nn.Module):
    def forward(self, x):
        return torch.nn.functional.max_pool2d(x, 2, return_indices=True)


def _pool_steps(plan):
    return [s for s in plan.steps if s.kernel == "max_pool2d"]


def test_unread_indices_are_not_computed_and_results_match():
    for cls in (PoolLast, PoolThenConv):
        m = seeded(cls)
        x = torch.randn(2, 3, 12, 12)
        plan = plan_module(m, (x,), chip="NPU-V3", precision="float16")
        pools = _pool_steps(plan)
        assert len(pools) == 1, cls
        assert pools[0].ops == ("aten.max_pool2d.default",), pools[0].ops
        assert not pools[0].attrs.get("return_indices"), pools[0].attrs
        assert not any(v.dtype == "int64" for v in plan.values.values()), cls
        c = torch.compile(m, backend="torchfl", options=V3)
        with torch.no_grad():
            y, ref = c(x), m(x)
        assert y.shape == ref.shape and rel_err(y, ref) < FP16_TOL, cls


def test_returned_indices_are_kept_and_exact():
    m = PoolWithIndices()
    x = torch.randperm(256).float().reshape(1, 4, 8, 8) / 8   # distinct in fp16: no ties
    plan = plan_module(m, (x,), chip="NPU-V3", precision="float16")
    (pool,) = _pool_steps(plan)
    assert pool.ops == ("aten.max_pool2d_with_indices.default",) and pool.attrs["return_indices"]
    c = torch.compile(m, backend="torchfl", options=V3)
    with torch.no_grad():
        (y, idx), (ref, ref_idx) = c(x), m(x)
    assert idx.dtype == torch.int64 and torch.equal(idx, ref_idx)
    assert rel_err(y, ref) < FP16_TOL
