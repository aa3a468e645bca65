"""Vector norms run on the chip (core 1.11.0's ``vector_norm`` kernel): ``torch.linalg.vector_norm``,
weight normalisation, gradient clipping.

Before: the eager zoo's last host fallback was Wav2Vec2's positional convolution, whose weight norm
(``torch.nn.utils.parametrizations.weight_norm``, dim 2) decomposes to ``linalg_vector_norm``:
"Fallback to CPU: aten::linalg_vector_norm (no rule for aten.linalg_vector_norm.default in core
1.10.0)". ``clip_grad_norm_`` met the same op in every training loop that clips.

Tolerances: the kernel sums in float64 what torch's CPU kernel sums in float64 (its accumulate type
for float32) or float32 (for float16), so float32 results agree to 1e-6 relative; a float16 result is
one rounding of a more exact value: within one float16 ulp (rtol 2 ** -10)."""
import pytest
import torch

from torchfl.runtime.eager.stats import ROUTES

NAN, INF = float("nan"), float("inf")
RTOL = {torch.float32: 1e-6, torch.float16: 2 ** -10}


def _fallbacks():
    return sum(n for (_op, route), n in ROUTES.items() if route == "host fallback")


@pytest.mark.parametrize("dev_fixture", ["fp32_dev", "fp16_dev"])
@pytest.mark.parametrize("ord", [2, 1, INF, -INF, 0, 3.5, -2.1])
def test_vector_norm_matches_torch_on_the_chip(request, dev_fixture, ord):
    d = request.getfixturevalue(dev_fixture)
    dt = torch.float32 if dev_fixture == "fp32_dev" else torch.float16
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 5, 6, generator=g).to(dt)
    x[0, 1, 2] = 0.0
    x[2, 3] = torch.tensor([NAN, 1, 2, 3, 4, 5]).to(dt)      # a NaN row
    x[3, 0] = torch.tensor([INF, -1, 2, -3, 4, 5]).to(dt)    # an inf row
    before = _fallbacks()
    for dim, keep in ((None, False), ((1, 2), True), (-1, False), ((0, 2), False)):
        ref = torch.linalg.vector_norm(x.float(), ord, dim=dim, keepdim=keep).to(dt)
        got = torch.linalg.vector_norm(x.to(d), ord, dim=dim, keepdim=keep).cpu()
        assert got.dtype == dt and got.shape == ref.shape
        torch.testing.assert_close(got, ref, rtol=RTOL[dt], atol=0, equal_nan=True)
    xt = x.transpose(0, 2)                                    # a non-contiguous input
    torch.testing.assert_close(torch.linalg.vector_norm(xt.to(d), ord, dim=0).cpu(),
                               torch.linalg.vector_norm(xt.float(), ord, dim=0).to(dt), rtol=RTOL[dt], atol=0,
                               equal_nan=True)
    assert _fallbacks() == before, "a norm fell back to the host"


def test_empty_norms_follow_torch(fp32_dev):
    """The norm of nothing is 0 for a finite order; the inf-norm of nothing has no value, and the
    kernel refuses it as torch does (the refusal reaches the user as torch's kind of error)."""
    e = torch.empty(3, 0)
    torch.testing.assert_close(torch.linalg.vector_norm(e.to(fp32_dev), 2, dim=1).cpu(),
                               torch.linalg.vector_norm(e, 2, dim=1))
    with pytest.raises(RuntimeError):
        torch.linalg.vector_norm(e, INF, dim=1)
    with pytest.raises(RuntimeError, match="empty"):
        torch.linalg.vector_norm(e.to(fp32_dev), INF, dim=1).cpu()


def test_weight_norm_conv_runs_on_the_chip(fp32_dev):
    """Wav2Vec2's positional convolution: weight norm over dim 2 of a grouped Conv1d (the eager zoo's
    last host fallback): nothing falls back, the output matches the CPU's."""
    from torch.nn.utils.parametrizations import weight_norm

    torch.manual_seed(0)
    conv = weight_norm(torch.nn.Conv1d(16, 16, 5, padding=2, groups=4), name="weight", dim=2).eval()
    x = torch.randn(2, 16, 40)
    npu = weight_norm(torch.nn.Conv1d(16, 16, 5, padding=2, groups=4), name="weight", dim=2).eval()
    npu.load_state_dict(conv.state_dict())
    npu = npu.to(fp32_dev)
    before = _fallbacks()
    with torch.no_grad():
        ref, out = conv(x), npu(x.to(fp32_dev)).cpu()
    assert _fallbacks() == before, "weight norm fell back to the host"
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)


def test_gradient_clipping_runs_on_the_chip(fp32_dev):
    """``clip_grad_norm_`` (the total 2-norm of every gradient, then a scale) on the chip: the total
    and the clipped gradients match the CPU's; nothing falls back."""
    g = torch.Generator().manual_seed(5)
    shapes = [(8, 16), (16,), (4, 4, 3, 3), (1,)]
    cpu = [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]
    for p in cpu:
        p.grad = torch.randn(p.shape, generator=g) * 3
    npu = [torch.nn.Parameter(p.detach().to(fp32_dev)) for p in cpu]
    for p, c in zip(npu, cpu):
        p.grad = c.grad.to(fp32_dev)
    before = _fallbacks()
    total = torch.nn.utils.clip_grad_norm_(npu, 0.5)
    ref = torch.nn.utils.clip_grad_norm_(cpu, 0.5)
    assert _fallbacks() == before, "gradient clipping fell back to the host"
    torch.testing.assert_close(total.cpu(), ref, rtol=1e-6, atol=0)
    for p, c in zip(npu, cpu):
        torch.testing.assert_close(p.grad.cpu(), c.grad, rtol=1e-6, atol=1e-7)


def test_a_norm_asked_in_its_own_dtype_runs_on_the_chip(fp32_dev):
    """``dtype=`` equal to the input's is no conversion (bfloat16 weight norm asks for float32, which
    the precision policy plans as the input's dtype): it runs on the chip; another dtype is a cast the
    kernel does not do, refused by name and run on the host."""
    x = torch.randn(6, 7)
    before = _fallbacks()
    got = torch.linalg.vector_norm(x.to(fp32_dev), 2, dim=1, dtype=torch.float32).cpu()
    assert _fallbacks() == before
    torch.testing.assert_close(got, torch.linalg.vector_norm(x, 2, dim=1), rtol=1e-6, atol=0)
    h = x.half()
    got = torch.linalg.vector_norm(h.to(fp32_dev), 2, dim=1, dtype=torch.float32).cpu()
    assert _fallbacks() == before + 1 and got.dtype == torch.float32
    torch.testing.assert_close(got, torch.linalg.vector_norm(h, 2, dim=1, dtype=torch.float32), rtol=1e-6, atol=0)
