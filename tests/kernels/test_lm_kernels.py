"""The language-model block kernels (kernels/lm: rms_norm, silu_mul, rope) against Hugging Face's
own eager modules on the same inputs: float32 within 1e-5 relative, float16 / bfloat16 at the
rounding points of the eager module (RoPE and the SwiGLU product bit-exact; RMSNorm's float32
statistics may differ from torch's summation order, so one unit of the last place); NaN / inf
rows, empty tensors, permuted (non-contiguous) inputs; counted == predicted on small and large
caches; one-line errors for bad shapes."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import DeviceMemory
from torchfl.kernels.catalog import CATALOG
from torchfl.kernels.errors import KernelError

from .helpers import CACHES, bytes_monotone, chip_for, dev, run_checked

DTYPES = ("float32", "float16", "bfloat16")
F32_RTOL, F32_ATOL = 1e-5, 1e-6


def _t(dt):
    return getattr(torch, dt)


def _llama_rms(x, w, eps=1e-6):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    m = LlamaRMSNorm(x.shape[-1], eps=eps).to(x.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
        return m(x)


def _rope_ref(q, cos, sin):
    from transformers.models.llama.modeling_llama import rotate_half

    return q * cos + rotate_half(q) * sin


def _check(got, ref, dt, exact, what):
    got, ref = got.float(), ref.float()
    if dt == "float32":
        torch.testing.assert_close(got, ref, rtol=F32_RTOL, atol=F32_ATOL, equal_nan=True, msg=lambda m: f"{what}: {m}")
    elif exact:
        assert torch.equal(got.nan_to_num(7.0), ref.nan_to_num(7.0)), f"{what} [{dt}]: not bit-exact, max diff " \
            f"{(got - ref).abs().max().item()}"
    else:     # one unit of the last place (float16 2^-10, bfloat16 2^-7 relative)
        ulp = 2.0 ** (-10 if dt == "float16" else -7)
        torch.testing.assert_close(got, ref, rtol=ulp, atol=ulp, equal_nan=True, msg=lambda m: f"{what} [{dt}]: {m}")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("cache", CACHES)
def test_rms_norm_matches_llama_rmsnorm(dt, cache):
    chip = chip_for(dt, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 40, 96, generator=g) * 3).to(_t(dt))
    w = torch.randn(96, generator=g).to(_t(dt))
    (y,), plan = run_checked("rms_norm", chip, {"x": dev(x, mem), "weight": dev(w, mem)}, {"eps": 1e-6})
    _check(y.to_torch(), _llama_rms(x, w), dt, False, "rms_norm")
    if cache == CACHES[0]:
        assert plan.config.strategy == "streamed"


@pytest.mark.parametrize("dt", ("float16", "bfloat16"))
def test_rms_norm_gemma_rounds_once(dt):
    """Gemma multiplies by (1 + w) in float32 and rounds once (round_normed false, float32 weight)."""
    chip = chip_for(dt)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 64, generator=g).to(_t(dt))
    w1 = 1.0 + torch.randn(64, generator=g) * 0.1
    (y,), _ = run_checked("rms_norm", chip, {"x": dev(x, mem), "weight": dev(w1, mem)},
                          {"eps": 1e-6, "round_normed": False})
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w1).to(_t(dt))
    _check(y.to_torch(), ref, dt, False, "rms_norm gemma")


@pytest.mark.parametrize("dt", DTYPES)
def test_rms_norm_nan_inf_rows_and_no_weight(dt):
    chip = chip_for(dt)
    mem = DeviceMemory(chip)
    x = torch.randn(4, 32)
    x[1, 3] = float("nan")
    x[2, 5] = float("inf")
    x[3] = 0.0                       # rsqrt(eps): finite, all zeros out
    x = x.to(_t(dt))
    (y,), _ = run_checked("rms_norm", chip, {"x": dev(x, mem)}, {"eps": 1e-5})
    _check(y.to_torch(), _llama_rms(x, torch.ones(32, dtype=_t(dt)), 1e-5), dt, False, "rms_norm nan/inf")
    got = y.to_torch().float()
    # a NaN poisons its row; an inf makes rsqrt 0: NaN where it was (inf * 0), 0 elsewhere
    assert got[1].isnan().all() and got[2, 5].isnan() and (got[2, :5] == 0).all() and (got[3] == 0).all()


@pytest.mark.parametrize("shape", [(0, 16), (2, 0), (0,)])
def test_empty_tensors(shape):
    chip = chip_for("float16")
    mem = DeviceMemory(chip)
    x = torch.randn(shape).half()
    (y,), plan = run_checked("rms_norm", chip, {"x": dev(x, mem)})
    assert y.shape == tuple(shape) and plan.traffic.bytes == 0
    (y,), plan = run_checked("silu_mul", chip, {"a": dev(x, mem), "b": dev(x, mem)})
    assert y.shape == tuple(shape) and plan.traffic.bytes == 0
    q = torch.randn(1, 2, 0, 8).half()
    cos = torch.randn(1, 1, 0, 8).half()
    (y,), plan = run_checked("rope", chip, {"x": dev(q, mem), "cos": dev(cos, mem), "sin": dev(cos, mem)})
    assert y.shape == (1, 2, 0, 8) and plan.traffic.bytes == 0


@pytest.mark.parametrize("dt", DTYPES)
def test_permuted_inputs(dt):
    """Inputs stored in a permuted physical layout (a non-contiguous logical view)."""
    chip = chip_for(dt)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 5, 16, generator=g).to(_t(dt))
    w = torch.randn(16, generator=g).to(_t(dt))
    (y,), _ = run_checked("rms_norm", chip, {"x": dev(x, mem, layout="NHWC"), "weight": dev(w, mem)})
    _check(y.to_torch(), _llama_rms(x, w), dt, False, "rms_norm permuted")
    b = torch.randn(2, 3, 5, 16, generator=g).to(_t(dt))
    (y,), _ = run_checked("silu_mul", chip, {"a": dev(x, mem, layout="NHWC"), "b": dev(b, mem, layout="NWHC")})
    _check(y.to_torch(), F.silu(x) * b, dt, True, "silu_mul permuted")
    cos, sin = torch.randn(2, 1, 5, 16, generator=g).to(_t(dt)), torch.randn(2, 1, 5, 16, generator=g).to(_t(dt))
    (y,), _ = run_checked("rope", chip, {"x": dev(x, mem, layout="NHWC"), "cos": dev(cos, mem, layout="NCWH"),
                                         "sin": dev(sin, mem)})
    _check(y.to_torch(), _rope_ref(x, cos, sin), dt, True, "rope permuted")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("cache", CACHES)
def test_silu_mul_matches_eager(dt, cache):
    chip = chip_for(dt, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(3)
    a = (torch.randn(5, 300, generator=g) * 4).to(_t(dt))
    b = torch.randn(5, 300, generator=g).to(_t(dt))
    a[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -100.0]).to(_t(dt))
    (y,), _ = run_checked("silu_mul", chip, {"a": dev(a, mem), "b": dev(b, mem)})
    _check(y.to_torch(), F.silu(a) * b, dt, True, "silu_mul")


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("tables", [(1, 1), (2, 1), (2, 4)])
def test_rope_matches_apply_rotary_pos_emb(dt, cache, tables):
    chip = chip_for(dt, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(4)
    q = (torch.randn(2, 4, 9, 32, generator=g) * 2).to(_t(dt))
    cos = torch.randn(*tables, 9, 32, generator=g).to(_t(dt))
    sin = torch.randn(*tables, 9, 32, generator=g).to(_t(dt))
    q[1, 2, 3, 5] = float("nan")
    q[0, 1, 0, 20] = float("inf")
    (y,), _ = run_checked("rope", chip, {"x": dev(q, mem), "cos": dev(cos, mem), "sin": dev(sin, mem)})
    _check(y.to_torch(), _rope_ref(q, cos, sin), dt, True, "rope")


def test_bfloat16_emulated_chip():
    """A chip with bfloat16_emulation computes through float16 (inputs decode at fp16 precision)."""
    chip = chip_for("bfloat16_emulated")
    mem = DeviceMemory(chip)
    x = torch.randn(3, 64).bfloat16()
    (y,), _ = run_checked("rms_norm", chip, {"x": dev(x, mem, "bfloat16_emulated")})
    torch.testing.assert_close(y.to_torch().float(), _llama_rms(x, torch.ones(64).bfloat16()).float(),
                               rtol=3.2e-2, atol=2e-2)


@pytest.mark.parametrize("name,shapes,attrs", [
    ("rms_norm", {"x": (64, 4096), "weight": (4096,)}, {}),
    ("silu_mul", {"a": (64, 11008), "b": (64, 11008)}, {}),
    ("rope", {"x": (1, 32, 64, 128), "cos": (1, 1, 64, 128), "sin": (1, 1, 64, 128)}, {}),
])
def test_bigger_cache_never_moves_more(name, shapes, attrs):
    bytes_monotone(name, shapes, attrs, "float16", caches=(64 << 10, 256 << 10, 1 << 20, 8 << 20, 64 << 20))


@pytest.mark.parametrize("name,shapes,msg", [
    ("rms_norm", {"x": (2, 8), "weight": (4,)}, "weight must have shape (8,)"),
    ("silu_mul", {"a": (2, 8), "b": (2, 4)}, "a and b must have one shape"),
    ("rope", {"x": (2, 8, 16), "cos": (8, 16), "sin": (8, 16)}, "x must be (batch, heads, sequence, head_dim)"),
    ("rope", {"x": (1, 2, 8, 15), "cos": (1, 1, 8, 15), "sin": (1, 1, 8, 15)}, "head_dim must be even"),
    ("rope", {"x": (1, 2, 8, 16), "cos": (1, 1, 4, 16), "sin": (1, 1, 4, 16)}, "cos must be (1 or 1, 1 or 2, 8, 16)"),
])
def test_bad_shapes_are_one_line_errors(name, shapes, msg):
    with pytest.raises(KernelError) as e:
        CATALOG[name].problem(shapes, {}, "float16")
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_a_row_that_does_not_fit_is_refused_with_the_cache_named():
    from torchfl.kernels import ChipModel

    spec = CATALOG["rms_norm"]
    p = spec.problem({"x": (4, 1 << 16)}, {}, "float32")
    with pytest.raises(KernelError, match="does not fit twice in the 65536 B cache"):
        spec.tile(p, ChipModel(cache_bytes=64 << 10))
