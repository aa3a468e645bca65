"""core 1.25.0 (issue 48, held-out zoo): two ops of architectures beyond both zoos, planned on the
chip with no fallback (strict) in both modes, against torch on the same inputs.

- ``pow.Scalar`` (a number to tensor powers): MPT's ALiBi slopes ``1 / torch.pow(2, base)`` fell
  back on ``npu`` (compiled, the slopes are folded); decomposed into ``full_like`` + the pow kernel.
  Tolerance: float32 4 ulps relative (one pow); float16 1e-3 relative (one rounding, 2^-11).
- ``slice_scatter`` (what a write into a slice is once functionalised: DeepSeek-V3's
  ``key_states[..., :nope].copy_(k_nope)``, ``key_states[..., nope:].copy_(k_rot)``) fell back
  compiled; decomposed into the slices it keeps and a concat. Exact (data movement only).
"""
import pytest
import torch

from torchfl.planner import plan_module
from torchfl.runtime.executor import Executor

CHIPS = [("TFL-X1", None, torch.float32, 4 * 2 ** -23), ("NPU-V3", "float16", torch.float16, 1e-3)]


class Slopes(torch.nn.Module):
    def forward(self, base):
        return 1.0 / torch.pow(2, base)


@pytest.mark.parametrize("chip,precision,dtype,rtol", CHIPS)
def test_pow_of_a_number_planned_on_the_chip(chip, precision, dtype, rtol):
    base = torch.tensor([0.0, 0.5, 1.0, 2.5, 8.0, -3.0, 15.0])
    plan = plan_module(Slopes(), (base,), chip=chip, precision=precision, strict=True)
    assert any(d.rule.endswith("pow_scalar_base") for d in plan.decomposed)
    (got,) = Executor(plan).run((base,))
    ref = Slopes()(base.to(dtype).double())
    torch.testing.assert_close(got.double(), ref, rtol=rtol, atol=0.0)


def test_pow_of_a_number_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    base = torch.arange(1, 9, dtype=torch.float16) * 0.5
    got = torch.pow(2, base.to(fp16_dev)).cpu()
    assert got.dtype == torch.float16
    torch.testing.assert_close(got.double(), torch.pow(2, base.double()), rtol=1e-3, atol=0.0)


class Keys(torch.nn.Module):
    """DeepSeek-V3's keys: the no-rotary part written first, the rotary part after it."""

    def forward(self, buf, nope, rot):
        k = torch.slice_scatter(buf, nope, dim=-1, start=0, end=nope.shape[-1])
        return torch.slice_scatter(k, rot, dim=3, start=nope.shape[-1])


def _keys():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(2, 4, 16, 24, generator=g), torch.randn(2, 4, 16, 16, generator=g),
            torch.randn(2, 4, 16, 8, generator=g))


@pytest.mark.parametrize("chip,precision,dtype,rtol", CHIPS)
def test_slice_scatter_planned_on_the_chip(chip, precision, dtype, rtol):
    xs = tuple(x.to(dtype).float() for x in _keys())
    plan = plan_module(Keys(), xs, chip=chip, precision=precision, strict=True)
    assert sum(d.rule.endswith("slice_scatter_joined") for d in plan.decomposed) == 2
    (got,) = Executor(plan).run(xs)
    assert torch.equal(got.float(), Keys()(*xs))


@pytest.mark.parametrize("start,end", [(0, 5), (5, None), (3, 9), (-8, None), (0, 2 ** 62)])
def test_slice_scatter_on_the_eager_device(fp16_dev, monkeypatch, start, end):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(1)).half()
    n = len(range(12)[slice(start, end)])
    src = torch.randn(3, n, generator=torch.Generator().manual_seed(2)).half()
    got = torch.slice_scatter(x.to(fp16_dev), src.to(fp16_dev), dim=1, start=start, end=end).cpu()
    assert torch.equal(got, torch.slice_scatter(x, src, dim=1, start=start, end=end))


class GroupMask(torch.nn.Module):
    """DeepSeek-V3's router: a 1 at each token's chosen expert groups (``scatter_`` of a value)."""

    def forward(self, scores):
        idx = torch.topk(scores, k=2, dim=-1, sorted=False)[1]
        return torch.zeros_like(scores).scatter_(1, idx, 1)


@pytest.mark.parametrize("chip,precision,dtype,rtol", CHIPS)
def test_scatter_of_a_value_planned_on_the_chip(chip, precision, dtype, rtol):
    """core 1.26.0's scatter_value_put: the value at (row, index[row, j]) by the index_put kernel. Exact."""
    scores = torch.randn(24, 8, generator=torch.Generator().manual_seed(3)).to(dtype).float()
    plan = plan_module(GroupMask(), (scores,), chip=chip, precision=precision, strict=True)
    assert any(d.rule.endswith("scatter_value_put") for d in plan.decomposed)
    (got,) = Executor(plan).run((scores,))
    assert torch.equal(got.float(), GroupMask()(scores))


def test_scatter_of_a_value_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(4)).half()
    idx = torch.tensor([[0, 4], [1, 1], [3, 2], [4, 0]])            # fewer rows than x, a repeated index
    got = x.to(fp16_dev).scatter_(1, idx.to(fp16_dev), -2.5).cpu()
    assert torch.equal(got, x.clone().scatter_(1, idx, -2.5))


class Resize(torch.nn.Module):
    """MobileViT's feature resize (bilinear, ``F.interpolate``): fell back in both modes."""

    def __init__(self, align_corners):
        super().__init__()
        self.align_corners = align_corners

    def forward(self, x):
        return torch.nn.functional.interpolate(x, size=(6, 10), mode="bilinear", align_corners=self.align_corners)


@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("chip,precision,dtype,rtol", CHIPS)
def test_bilinear_resize_planned_on_the_chip(chip, precision, dtype, rtol, align_corners):
    """torch's own decomposition (gathers of the 4 neighbours, weighted sums) on existing kernels.
    Tolerance: float32 1e-6 absolute; float16 4e-3 of values within 4 (weights and sums rounded)."""
    x = torch.randn(2, 4, 4, 5, generator=torch.Generator().manual_seed(5)).to(dtype).float()
    plan = plan_module(Resize(align_corners), (x,), chip=chip, precision=precision, strict=True)
    (got,) = Executor(plan).run((x,))
    torch.testing.assert_close(got.float(), Resize(align_corners)(x), rtol=0, atol=1e-6 if precision is None else 4e-3)


def test_bilinear_resize_on_the_eager_device(fp16_dev, monkeypatch):
    """The decomposition computes its source coordinates in float32: a float16-only chip needs the
    float16 policy, as the zoo runs it (TORCHFL_PRECISION)."""
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    monkeypatch.setenv("TORCHFL_PRECISION", "float16")
    x = torch.randn(2, 4, 4, 5, generator=torch.Generator().manual_seed(5)).half()
    got = Resize(False)(x.to(fp16_dev)).cpu().float()
    torch.testing.assert_close(got, Resize(False)(x.float()), rtol=0, atol=4e-3)


class Joined(torch.nn.Module):
    """A concat of many tensors (every layer's features, a per-layer cache joined): more than the
    8 the concat kernel took fell back whole."""

    def forward(self, x):
        return torch.cat([x * (i + 1) for i in range(12)] + [x[:, :1]], dim=1)


@pytest.mark.parametrize("chip,precision,dtype,rtol", CHIPS)
def test_concat_of_many_tensors_planned_on_the_chip(chip, precision, dtype, rtol):
    x = torch.randint(-4, 5, (3, 5), generator=torch.Generator().manual_seed(6)).float()   # exact in float16
    plan = plan_module(Joined(), (x,), chip=chip, precision=precision, strict=True)
    assert "concat" in {s.kernel for s in plan.steps}
    (got,) = Executor(plan).run((x,))
    assert torch.equal(got.float(), Joined()(x))


def test_concat_of_many_tensors_on_the_eager_device(fp16_dev, monkeypatch):
    monkeypatch.setenv("TORCHFL_STRICT", "1")
    xs = [torch.full((2, i + 1), float(i), dtype=torch.float16) for i in range(20)]
    got = torch.cat([x.to(fp16_dev) for x in xs], dim=1).cpu()
    assert torch.equal(got, torch.cat(xs, dim=1))
