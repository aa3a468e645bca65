"""What the zoo's families do on the eager device outside their compiled graphs runs on the
chip (core 1.10.0): torch.minimum / maximum, clamp with tensor bounds, the sum of a bool mask,
and pow of two tensors.

Before: T5 on the eager device logged "Fallback to CPU: aten::minimum (no rule for
aten.minimum.default in core 1.9.0)" (its relative-position buckets) and, in float16, "aten::clamp
(no rule for aten.clamp.Tensor ...)" (it clamps hidden states to a 0-d tensor bound). Compiled,
T5's buckets are folded (input-independent), so only the eager device met them.

Before, too: the eight decoder families (GPT-2, OPT, GPT-NeoX, Phi, LLaMA, Mistral, Qwen2, Gemma)
fell back twice a forward for ``aten::sum`` of a bool mask ("dtype bool not in
tensor.supported_dtypes"), BLOOM once for ``aten::pow`` of a float base and int32 powers
(its ALiBi slopes: "no rule for aten.pow.Tensor_Tensor").

Results of minimum / maximum / clamp are one of the operands: exact (tolerance 0), nan included; float16 hidden states
clamped to a float32 0-d bound stay float16, as in torch."""
import pytest
import torch

from torchfl.runtime.eager.stats import ROUTES

NAN, INF = float("nan"), float("inf")


def _fallbacks(name):
    return sum(n for (op, route), n in ROUTES.items() if route == "host fallback" and name in str(op))


def _equal(got, ref):
    got = got.cpu()
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert torch.equal(got.isnan(), ref.isnan())
    assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(ref))


@pytest.mark.parametrize("dev_fixture", ["fp32_dev", "fp16_dev"])
def test_minimum_maximum_and_clamp_with_tensor_bounds_run_on_the_chip(request, dev_fixture):
    d = request.getfixturevalue(dev_fixture)
    dt = torch.float32 if dev_fixture == "fp32_dev" else torch.float16
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 1, 7, generator=g).to(dt)
    b = torch.randn(4, 7, generator=g).to(dt)
    a[0, 0, :3] = torch.tensor([NAN, INF, -INF])
    b[1, 3:5] = torch.tensor([NAN, 0.0])
    # 0-d bounds; float16 only on the float16-only chip (float32 there needs a precision policy)
    lo, hi = torch.tensor(-0.5).to(dt), torch.tensor(0.25).to(dt)
    before = {n: _fallbacks(n) for n in ("minimum", "maximum", "clamp")}
    _equal(torch.minimum(a.to(d), b.to(d)), torch.minimum(a, b))
    _equal(torch.maximum(a.to(d), b.to(d)), torch.maximum(a, b))
    _equal(torch.clamp(a.to(d), min=lo.to(d), max=hi.to(d)), torch.clamp(a, min=lo, max=hi))
    _equal(torch.clamp(a.to(d), max=hi.to(d)), torch.clamp(a, max=hi))
    if dt == torch.float32:    # float16 hidden states, float32 0-d bounds (T5's clamp_value): float16 out
        h, flo, fhi = a.half(), torch.tensor(-0.5), torch.tensor(0.25)
        _equal(torch.clamp(h.to(d), min=flo.to(d), max=fhi.to(d)), torch.clamp(h, min=flo, max=fhi))
    pos = torch.arange(12).reshape(3, 4)                      # int64 index math (T5's buckets)
    _equal(torch.minimum(pos.to(d), torch.full_like(pos, 5).to(d)), torch.minimum(pos, torch.full_like(pos, 5)))
    assert {n: _fallbacks(n) for n in before} == before, "an op fell back to the host"


@pytest.mark.parametrize("dev_fixture", ["fp32_dev", "fp16_dev"])
def test_sum_of_a_bool_mask_and_pow_of_two_tensors_run_on_the_chip(request, dev_fixture):
    """Sums of bool / int64 are exact (int64, as torch); pow of a float base and integer powers
    is float (float64 pow rounded once: within 1 ulp of torch's float32 pow, checked at 2 ulps
    of the dtype)."""
    d = request.getfixturevalue(dev_fixture)
    dt = torch.float32 if dev_fixture == "fp32_dev" else torch.float16
    mask = torch.tensor([[1, 1, 0, 1], [0, 0, 0, 0]], dtype=torch.bool)
    ids = torch.arange(-6, 6).reshape(3, 4)
    before = {n: _fallbacks(n) for n in ("sum", "pow")}
    _equal(mask.to(d).sum(), mask.sum())
    _equal(mask.to(d).sum(-1), mask.sum(-1))
    _equal(ids.to(d).sum(0), ids.sum(0))
    base = torch.tensor(2 ** (-8 / 12)).to(dt)                  # BLOOM: base ** arange(1, 1 + heads)
    powers = torch.arange(1, 13, dtype=torch.int32)
    got, ref = torch.pow(base.to(d), powers.to(d)).cpu(), torch.pow(base, powers)
    assert got.dtype == ref.dtype == dt
    torch.testing.assert_close(got, ref, rtol=2 * torch.finfo(dt).eps, atol=0)
    assert {n: _fallbacks(n) for n in before} == before, "an op fell back to the host"


def test_compiled_minimum_and_clamp_with_tensor_bounds_have_no_fallback():
    from torchfl.planner import plan_module

    class M(torch.nn.Module):
        def forward(self, x, y, bound):
            return torch.clamp(torch.minimum(x, y), min=-bound, max=bound)

    x, y, bound = torch.randn(2, 8), torch.randn(2, 8), torch.tensor(0.5)
    plan = plan_module(M(), (x, y, bound), chip="TFL-X1")
    assert not plan.fallbacks, plan.fallbacks
    assert {"minimum", "maximum"} <= {s.kernel for s in plan.steps}
    compiled = torch.compile(M(), backend="torchfl", options={"chip": "TFL-X1"})
    _equal(compiled(x, y, bound), M()(x, y, bound))
