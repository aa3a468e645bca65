"""Compiled-path gaps of issue 33 item 3, strict on the chip through torch.compile, compared
with eager: cat with Hugging Face's empty 1-D cache tensors, avg_pool2d in every mode,
boolean reductions (any/all over dims), addmm with any broadcastable bias, float64 arguments
inside ops under a precision policy. Real planner, real kernels."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.runtime.backend import recording

V3 = {"chip": "NPU-V3", "precision": "float16", "strict": True}
X1 = {"chip": "TFL-X1", "strict": True}      # a float32 unit: float32 graphs need no policy
TOL = {torch.float16: 2e-3, torch.float32: 1e-4}


def _run(fn, *args, options=V3):
    with torch.no_grad():
        ref = fn(*args)
        with recording() as r:
            got = torch.compile(fn, backend="torchfl", options=options, fullgraph=True)(*args)
    plans = [p for _cg, p, _ in r.entries]
    assert plans and not any(p.fallbacks for p in plans)
    return got, ref, plans


def _close(got, ref, rtol=2e-3, atol=2e-3):
    assert got.dtype == ref.dtype and got.shape == ref.shape
    torch.testing.assert_close(got, ref, rtol=rtol, atol=atol, equal_nan=True)


def test_cat_with_an_empty_1d_cache_tensor_stays_on_chip():
    """Hugging Face's DynamicCache concatenates ``torch.tensor([])`` with (B, H, L, D) keys."""
    def fn(k, v):
        empty = torch.tensor([], dtype=k.dtype)
        return torch.cat([empty, k], dim=-2) + torch.cat([v, empty, v], dim=-2)[:, :, :3]
    k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 4, 3, 8)
    got, ref, _ = _run(fn, k, v)
    _close(got, ref)


@pytest.mark.parametrize("kw", [
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, stride=2, divisor_override=3),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 0), ceil_mode=True, divisor_override=5),
    dict(kernel_size=7, ceil_mode=True),          # EfficientNet's pooler: a window larger than the map
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_avg_pool2d_modes(kw):
    x = torch.randn(2, 4, 5, 6)
    got, ref, _ = _run(lambda x: F.avg_pool2d(x, **kw), x)
    _close(got, ref)


@pytest.mark.parametrize("op", ["any", "all"])
@pytest.mark.parametrize("dim", [None, -1, 0, (0, 2)])
def test_boolean_reductions(op, dim):
    x = torch.randn(3, 5, 4)
    x[1] = 1.0          # a row where every element is positive: all() is true there
    x[:, :, 3] = -1.0   # and columns where none is

    def fn(x):
        mask = x > 0
        return getattr(mask, op)() if dim is None else getattr(mask, op)(dim=dim)
    got, ref, _ = _run(fn, x)
    assert got.dtype == torch.bool and torch.equal(got, ref)


@pytest.mark.parametrize("bias_shape", [(5,), (1, 5), (3, 1), (3, 5), (1,), ()])
@pytest.mark.parametrize("options", [V3, X1], ids=["NPU-V3", "TFL-X1"])
def test_addmm_with_any_broadcastable_bias(bias_shape, options):
    g = torch.Generator().manual_seed(0)
    b, a, w = torch.randn(bias_shape, generator=g), torch.randn(3, 4, generator=g), torch.randn(4, 5, generator=g)
    got, ref, _ = _run(lambda b, a, w: torch.addmm(b, a, w, beta=0.5, alpha=2.0), b, a, w, options=options)
    tol = 1e-4 if options is X1 else 4e-3
    _close(got, ref, tol, tol)


def test_float64_argument_inside_an_op_follows_the_precision_policy():
    """``softmax(x, dtype=torch.float64)`` under float16: the float64 cast is the policy's."""
    x = torch.randn(3, 7)
    got, ref, plans = _run(lambda x: torch.softmax(x, -1, dtype=torch.float64) * 2, x)
    assert got.dtype == torch.float64
    _close(got, ref, 4e-3, 4e-3)


# OpInfo samples that fell back on a chip with an fp32 unit (issue 33): unbatched images,
# sparse=True embeddings, permute with negative dims
@pytest.mark.parametrize("options", [V3, X1], ids=["NPU-V3", "TFL-X1"])
def test_unbatched_conv2d_and_adaptive_pool(options):
    g = torch.Generator().manual_seed(1)
    x, w, b = torch.randn(4, 7, 6, generator=g), torch.randn(5, 4, 3, 3, generator=g), torch.randn(5, generator=g)
    tol = 1e-4 if options is X1 else 4e-3
    got, ref, plans = _run(lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), x, w, b, options=options)
    _close(got, ref, tol, tol)
    assert any(p.decomposed for p in plans)
    got, ref, _ = _run(lambda x: F.adaptive_avg_pool2d(x, (3, 2)), x, options=options)
    _close(got, ref, tol, tol)


def test_sparse_embedding_lookup_and_negative_permute_dims():
    g = torch.Generator().manual_seed(2)
    w, idx = torch.randn(10, 4, generator=g), torch.tensor([[1, 3], [9, 0]])
    got, ref, _ = _run(lambda w, i: F.embedding(i, w, sparse=True) * 2, w, idx, options=X1)
    _close(got, ref, 1e-5, 1e-5)
    x = torch.randn(2, 3, 4, 5, generator=g)
    got, ref, _ = _run(lambda x: x.permute(0, -2, -1, 1) * 2, x, options=X1)
    _close(got, ref, 0, 0)
