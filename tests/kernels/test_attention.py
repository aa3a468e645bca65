"""Attention vs torch SDPA: causal, masks (bool / additive, broadcast), dtypes, layouts,
Lq != Lk, Dv != D, caches that force streamed / kv_resident / resident tilings."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import DeviceMemory, KernelError
from torchfl.kernels.catalog import CATALOG

from .helpers import as_f32, assert_close, bytes_monotone, chip_for, dev, run_checked

DT = ["float32", "float16", "bfloat16", "bfloat16_emulated"]
SHAPES = [(1, 1, 1, 1, 1, 1), (2, 3, 37, 53, 16, 24), (1, 2, 130, 130, 64, 64), (1, 1, 5, 200, 8, 8),
          (1, 2, 0, 7, 8, 8)]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cache", (32 << 10, 256 << 10, 8 << 20))
def test_attention(dtype, shape, causal, cache):
    B, H, L, S, D, Dv = shape
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(L + S)
    q = dev(torch.randn(B, H, L, D, generator=g), mem, dtype, "NHCW")
    k = dev(torch.randn(B, H, S, D, generator=g), mem, dtype)
    v = dev(torch.randn(B, H, S, Dv, generator=g), mem, dtype, "NCWH")
    (o,), plan = run_checked("attention", chip, {"q": q, "k": k, "v": v}, {"causal": causal})
    ref = F.scaled_dot_product_attention(as_f32(q), as_f32(k), as_f32(v), is_causal=causal)
    assert_close(as_f32(o), ref, dtype, scale=2, what=f"attention {plan.config.strategy}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("mshape", [(1, 1, 37, 53), (37, 53), (2, 1, 1, 53), (2, 3, 37, 53)])
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("cache", (32 << 10, 8 << 20))
def test_attention_mask(dtype, mshape, kind, cache):
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    q, k, v = torch.randn(2, 3, 37, 16), torch.randn(2, 3, 53, 16), torch.randn(2, 3, 53, 16)
    if kind == "bool":
        m = torch.rand(*mshape) > 0.3
        m[..., 0] = True   # no fully-masked row
        md = dev(m, mem)
    else:
        m = torch.randn(*mshape)
        md = dev(m, mem, dtype)
    qd, kd, vd = dev(q, mem, dtype), dev(k, mem, dtype), dev(v, mem, dtype)
    (o,), _ = run_checked("attention", chip, {"q": qd, "k": kd, "v": vd, "mask": md}, {"scale": 0.3})
    ref = F.scaled_dot_product_attention(as_f32(qd), as_f32(kd), as_f32(vd),
                                         attn_mask=m if kind == "bool" else as_f32(md), scale=0.3)
    assert_close(as_f32(o), ref, dtype, scale=2)


def test_causal_streamed_skips_upper_tiles():
    spec = CATALOG["attention"]
    shapes = {"q": (1, 1, 512, 64), "k": (1, 1, 512, 64), "v": (1, 1, 512, 64)}
    chip = chip_for("float32", 64 << 10)
    full = spec.tile(spec.problem(shapes, {"causal": False}), chip)
    half = spec.tile(spec.problem(shapes, {"causal": True}), chip)
    assert half.traffic.bytes_read < full.traffic.bytes_read
    assert half.traffic.flops < full.traffic.flops


def test_errors():
    spec = CATALOG["attention"]
    with pytest.raises(KernelError, match="do not agree"):
        spec.problem({"q": (1, 2, 3, 4), "k": (1, 2, 3, 5), "v": (1, 2, 3, 4)})
    with pytest.raises(KernelError, match="does not broadcast"):
        spec.problem({"q": (1, 2, 3, 4), "k": (1, 2, 5, 4), "v": (1, 2, 5, 4), "mask": (3, 4)},
                     dtypes={"mask": "bool"})


@pytest.mark.parametrize("causal", [False, True])
def test_bigger_cache_never_more_bytes(causal):
    bytes_monotone("attention", {"q": (2, 4, 300, 64), "k": (2, 4, 300, 64), "v": (2, 4, 300, 64)},
                   {"causal": causal}, "float32")


# -- grouped-query attention (enable_gqa: fewer key/value heads than query heads) --------
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("heads", [(4, 1), (6, 2), (8, 4)])
@pytest.mark.parametrize("mode", ["plain", "causal", "bool", "float"])
@pytest.mark.parametrize("cache", (32 << 10, 8 << 20))
def test_attention_gqa(dtype, heads, mode, cache):
    H, Hkv = heads
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(H * 10 + Hkv)
    q = torch.randn(2, H, 19, 16, generator=g)
    k, v = torch.randn(2, Hkv, 23, 16, generator=g), torch.randn(2, Hkv, 23, 8, generator=g)
    inputs = {"q": dev(q, mem, dtype), "k": dev(k, mem, dtype, "NCWH"), "v": dev(v, mem, dtype)}
    kw = {}
    if mode == "bool":
        m = torch.rand(19, 23, generator=g) > 0.4
        inputs["mask"], kw["attn_mask"] = dev(m, mem), m
    elif mode == "float":
        m = torch.randn(2, 1, 19, 23, generator=g)
        inputs["mask"] = dev(m, mem, dtype)
        kw["attn_mask"] = as_f32(inputs["mask"])
    (o,), plan = run_checked("attention", chip, inputs, {"causal": mode == "causal"})
    ref = F.scaled_dot_product_attention(as_f32(inputs["q"]), as_f32(inputs["k"]), as_f32(inputs["v"]),
                                         is_causal=mode == "causal", enable_gqa=True, **kw)
    assert_close(as_f32(o), ref, dtype, scale=2, what=f"gqa {heads} {mode} {plan.config.strategy}")


def test_gqa_heads_must_group():
    with pytest.raises(KernelError, match="cannot be grouped over 4 key/value heads"):
        CATALOG["attention"].problem({"q": (1, 6, 3, 4), "k": (1, 4, 3, 4), "v": (1, 4, 3, 4)})


# -- rows with no visible key: torch 2.13 (CPU) returns zeros there, and so does the kernel --
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_fully_masked_rows_are_zero_as_torch(dtype, kind):
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    keep = torch.rand(5, 7) > 0.3
    keep[:, 0] = True
    keep[2] = False                      # query 2 sees no key
    m = keep if kind == "bool" else torch.zeros(5, 7).masked_fill(~keep, float("-inf"))
    md = dev(m, mem) if kind == "bool" else dev(m, mem, dtype)
    qd, kd, vd = dev(q, mem, dtype), dev(k, mem, dtype), dev(v, mem, dtype)
    (o,), _ = run_checked("attention", chip, {"q": qd, "k": kd, "v": vd, "mask": md})
    ref = F.scaled_dot_product_attention(as_f32(qd), as_f32(kd), as_f32(vd), attn_mask=m)
    assert torch.equal(ref[:, :, 2], torch.zeros_like(ref[:, :, 2]))   # what torch does (not NaN)
    assert_close(as_f32(o), ref, dtype, scale=2)


def test_no_keys_is_zero_as_torch():
    chip = chip_for("float32")
    mem = DeviceMemory(chip)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 0, 4)
    (o,), _ = run_checked("attention", chip, {"q": dev(q, mem, "float32"), "k": dev(k, mem, "float32"),
                                               "v": dev(k, mem, "float32")})
    torch.testing.assert_close(as_f32(o), F.scaled_dot_product_attention(q, k, k))


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("lq", [1, 3])
@pytest.mark.parametrize("mode", ["plain", "causal", "bool", "float"])
def test_attention_decode_over_a_cache(dtype, lq, mode):
    """A decode step: a few queries (the few-query path, Lq <= DECODE_LQ) over a 300-key cache,
    grouped-query (8 query heads over 2 key/value heads), q in another layout; the causal rule,
    a bool keep-mask with a fully masked row (zeros, as torch) and an additive mask; against
    torch in float32 within the dtype's tolerance, counted == predicted (run_checked)."""
    from torchfl.kernels.attention.decode import DECODE_LQ

    assert lq <= DECODE_LQ
    B, H, Hkv, S, D, Dv = 2, 8, 2, 300, 64, 32
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(lq)
    q = dev(torch.randn(B, H, lq, D, generator=g), mem, dtype, "NHCW")
    k = dev(torch.randn(B, Hkv, S, D, generator=g), mem, dtype)
    v = dev(torch.randn(B, Hkv, S, Dv, generator=g), mem, dtype)
    ins, attrs, mask = {"q": q, "k": k, "v": v}, {"causal": mode == "causal"}, None
    if mode == "bool":
        mask = torch.rand(B, 1, lq, S, generator=g) > 0.5
        mask[1, 0, 0] = False                       # a fully masked row: zeros, as torch
        ins["mask"] = dev(mask, mem)
    elif mode == "float":
        ins["mask"] = dev(torch.randn(1, H, lq, S, generator=g), mem, dtype)
        mask = as_f32(ins["mask"])
    (o,), _ = run_checked("attention", chip, ins, attrs)
    kr, vr = (as_f32(t).repeat_interleave(H // Hkv, dim=1) for t in (k, v))
    ref = F.scaled_dot_product_attention(as_f32(q), kr, vr, attn_mask=mask, is_causal=mode == "causal")
    if mode == "bool":
        ref = torch.nan_to_num(ref, nan=0.0)
    assert_close(as_f32(o), ref, dtype, scale=2)
