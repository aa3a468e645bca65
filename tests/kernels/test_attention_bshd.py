"""Attention with ``bshd`` (the rule pack's attention_bshd fusion): q, k, v stored [B, L, H, D]
and the output written [B, Lq, H, Dv], the transposes around attention folded into the
kernel's strides. Against torch SDPA on the transposed tensors, at the tolerances of
test_attention.py (helpers.assert_close per dtype, scale 2); counted bytes == the plan's
(run_checked), and equal to the plain [B, H, L, D] call's: only the storage order differs."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.kernels import DeviceMemory
from torchfl.kernels.catalog import CATALOG

from .helpers import as_f32, assert_close, chip_for, dev, run_checked

DT = ["float32", "float16", "bfloat16"]


def _sdpa(q, k, v, **kw):
    """torch's answer for [B, L, H, D] inputs, in [B, Lq, H, Dv]."""
    o = F.scaled_dot_product_attention(*(as_f32(t).transpose(1, 2) for t in (q, k, v)), **kw)
    return o.transpose(1, 2)


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("mode", ["plain", "causal", "bool", "float"])
@pytest.mark.parametrize("lq", [2, 37])
@pytest.mark.parametrize("cache", (32 << 10, 8 << 20))
def test_bshd_matches_torch(dtype, mode, lq, cache):
    B, H, S, D, Dv = 2, 3, 53, 16, 24
    chip = chip_for(dtype, cache)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(lq)
    q = dev(torch.randn(B, lq, H, D, generator=g), mem, dtype)
    k = dev(torch.randn(B, S, H, D, generator=g), mem, dtype)
    v = dev(torch.randn(B, S, H, Dv, generator=g), mem, dtype)
    ins, kw = {"q": q, "k": k, "v": v}, {"is_causal": mode == "causal"}
    if mode == "bool":
        m = torch.rand(B, 1, lq, S, generator=g) > 0.3
        m[..., 0] = True
        ins["mask"], kw["attn_mask"] = dev(m, mem), m
    elif mode == "float":
        ins["mask"] = dev(torch.randn(1, H, lq, S, generator=g), mem, dtype)
        kw["attn_mask"] = as_f32(ins["mask"])
    (o,), plan = run_checked("attention", chip, ins, {"causal": mode == "causal", "bshd": True})
    assert tuple(o.shape) == (B, lq, H, Dv)
    assert_close(as_f32(o), _sdpa(q, k, v, **kw), dtype, scale=2, what=f"bshd {mode} {plan.config.strategy}")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bshd_grouped_query(dtype):
    B, H, Hkv, L, D = 1, 8, 2, 40, 16
    chip = chip_for(dtype)
    mem = DeviceMemory(chip)
    g = torch.Generator().manual_seed(3)
    q = dev(torch.randn(B, L, H, D, generator=g), mem, dtype)
    k = dev(torch.randn(B, L, Hkv, D, generator=g), mem, dtype)
    v = dev(torch.randn(B, L, Hkv, D, generator=g), mem, dtype)
    (o,), _ = run_checked("attention", chip, {"q": q, "k": k, "v": v}, {"causal": True, "bshd": True})
    assert_close(as_f32(o), _sdpa(q, k, v, is_causal=True, enable_gqa=True), dtype, scale=2)


def test_bshd_moves_the_bytes_of_the_plain_call():
    spec = CATALOG["attention"]
    chip = chip_for("float16", 64 << 10)
    plain = spec.tile(spec.problem({"q": (2, 12, 512, 64), "k": (2, 12, 512, 64), "v": (2, 12, 512, 64)},
                                   {"causal": False}, "float16"), chip)
    bshd = spec.tile(spec.problem({"q": (2, 512, 12, 64), "k": (2, 512, 12, 64), "v": (2, 512, 12, 64)},
                                  {"causal": False, "bshd": True}, "float16"), chip)
    assert bshd.traffic == plain.traffic and bshd.config.tiles == plain.config.tiles
    assert "strided rows of 128 B" in bshd.config.notes
