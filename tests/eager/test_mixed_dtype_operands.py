"""Elementwise ops on operands of different dtypes run on the chip, promoted as torch promotes
(``planner/promote.py``: an explicit cast before the op; core 1.12.0 casts an index-path id to a float).

Before: every such call fell back to the host on the eager device, e.g. "Fallback to CPU: aten::lt (lt:
kernel lt: inputs must all be float16, got {'b': 'float32'}; insert a cast)" for a float16 tensor
compared with a float32 0-d tensor, "aten::where (where: input b must be float16, got int64)", and an
int64 tensor first in float arithmetic.

Results are torch's to the dtype's rounding of the same arithmetic: a cast is exact (float16 ->
float32, int64 ids < 2**24 -> float32) or one rounding (float32 -> float16), the op then the same IEEE
operation as torch's; comparisons and minimum/maximum are exact."""
import pytest
import torch

from torchfl.runtime.eager.stats import ROUTES

CASES = {
    "minimum": torch.minimum, "maximum": torch.maximum, "lt": torch.lt, "eq": torch.eq, "ge": torch.ge,
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
    "where": lambda a, b: torch.where(a > 0, a, b),
}


def _operands():
    g = torch.Generator().manual_seed(7)
    h = torch.randn(4, 5, generator=g).half()
    h[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")]).half()
    f = torch.randn(4, 5, generator=g)
    return {
        "half, float 0-d": (h, torch.tensor(0.25)),           # T5-style bound: the result stays float16
        "float 0-d, half": (torch.tensor(-0.5), h),
        "half, float": (h, f),                               # both dimensioned: float32
        "int64, float": (torch.arange(20).reshape(4, 5) - 7, f),
        "float, int64": (f, torch.arange(5) - 2),
        "half, int64": (h, torch.arange(5) - 2),
    }


def _fallbacks():
    return sum(n for (_op, route), n in ROUTES.items() if route == "host fallback")


def _same(got, ref):
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got.isnan(), ref.isnan()) if got.is_floating_point() else True
    if got.is_floating_point():
        torch.testing.assert_close(got, ref, rtol=torch.finfo(ref.dtype).eps, atol=0, equal_nan=True)
    else:
        assert torch.equal(got, ref)


@pytest.mark.parametrize("pair", list(_operands()))
def test_mixed_dtype_elementwise_runs_on_the_chip(fp32_dev, pair):
    a, b = _operands()[pair]
    before = _fallbacks()
    for name, fn in CASES.items():
        if name == "div" and not (a.is_floating_point() or b.is_floating_point()):
            continue
        _same(fn(a.to(fp32_dev), b.to(fp32_dev)).cpu(), fn(a, b))
    assert _fallbacks() == before, "a mixed-dtype elementwise op fell back to the host"


def test_mixed_dtype_elementwise_compiled():
    """The same promotion in a compiled graph: no fallback, torch's dtypes and values; the plan
    shows the inserted casts as cast steps."""
    import torchfl
    from torchfl.planner.api import plan_module

    class Mixed(torch.nn.Module):
        def forward(self, h, ids, bound):
            return torch.minimum(h, bound) + (ids * 0.5 < h.float()).half(), torch.where(h > 0, h, ids)

    h = torch.randn(3, 8).half()
    ids = torch.arange(8) - 3
    bound = torch.tensor(0.5)
    plan = plan_module(Mixed(), (h, ids, bound), "TFL-X1")
    assert plan.summary.fallbacks == 0, torchfl.explain(Mixed(), h, ids, bound, chip="TFL-X1")
    casts = [s for s in plan.steps if s.kernel == "cast" and any("_as_" in n for n in s.nodes)]
    assert casts, "the promotion's casts are steps of the plan"
    got = torch.compile(Mixed(), backend="torchfl", options={"chip": "TFL-X1"})(h, ids, bound)
    for g, r in zip(got, Mixed()(h, ids, bound)):
        _same(g, r)
