"""Attention on chips with and without an attention unit: grouped-query attention on the unit
(enable_gqa and HF's repeat_kv), the core pack's decomposition on DSP-M4 (planned, priced,
explained, run, matching eager), the seed's refusal on a unit whose heads exclude the call,
and decompositions that lose (on price, or because a part would fall back)."""
import pytest
import torch
import torch.nn.functional as F

from torchfl.planner import plan_module
from torchfl.planner.target import Target, bundled_packs
from torchfl.runtime import Executor

FP16 = dict(rtol=4e-3, atol=4e-3)   # fp16 scores between the parts: a few fp16 ulps of O(1) outputs


def _target(name, extra=()):
    from torchfl.hcd import load_hcd
    from torchfl.resources import bundled_hcds

    hcd = next(h for h in map(load_hcd, bundled_hcds()) if h.chip.name == name)
    return Target.of(hcd, bundled_packs() + tuple(extra))


class SDPA(torch.nn.Module):
    def __init__(self, causal=False, gqa=False):
        super().__init__()
        self.causal, self.gqa = causal, gqa

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal, enable_gqa=self.gqa)


class RepeatKV(torch.nn.Module):
    """What HF's LLaMA attention does with a mask: repeat_kv, then attention over all heads."""

    def forward(self, q, k, v, mask):
        B, Hkv, L, D = k.shape
        G = q.shape[1] // Hkv
        k = k[:, :, None].expand(B, Hkv, G, L, D).reshape(B, Hkv * G, L, D)
        v = v[:, :, None].expand(B, Hkv, G, L, D).reshape(B, Hkv * G, L, D)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _qkv(heads=4, kv=2, lq=9, lk=9, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, heads, lq, d, generator=g), torch.randn(2, kv, lk, d, generator=g),
            torch.randn(2, kv, lk, d, generator=g))


def _run(module, inputs, chip, precision="float16", extra=()):
    plan = plan_module(module, inputs, chip=_target(chip, extra), precision=precision)
    out = Executor(plan).run(inputs)[0]
    return plan, out, module(*inputs)


def _bool_mask(lq=9, lk=9):
    keep = torch.rand(lq, lk, generator=torch.Generator().manual_seed(3)) > 0.4
    keep[:, 0] = True
    keep[4] = False                      # a query that sees no key: torch gives 0 there
    return keep


@pytest.mark.parametrize("case", ["causal_gqa", "bool_mask", "float_mask", "plain_gqa"])
def test_dsp_m4_attention_decomposed_on_chip(case):
    q, k, v = _qkv(kv=2 if "gqa" in case else 4)
    inputs, module = (q, k, v), SDPA(causal=case == "causal_gqa", gqa="gqa" in case)
    if case == "bool_mask":
        inputs += (_bool_mask(),)
    if case == "float_mask":
        inputs += (torch.randn(2, 1, 9, 9, generator=torch.Generator().manual_seed(1)),)
    plan, out, ref = _run(module, inputs, "DSP-M4")
    assert not plan.fallbacks, plan.fallbacks
    (d,) = plan.decomposed
    assert d.op == "aten.scaled_dot_product_attention.default" and d.rule.endswith("sdpa_gemm_softmax")
    kernels = [s.kernel for s in plan.steps if any(n in d.parts for n in s.nodes)]
    assert kernels.count("bmm") == 2 and "softmax" in kernels and "attention" not in kernels
    assert ("expand" in kernels) == ("gqa" in case)
    torch.testing.assert_close(out, ref, **FP16)
    if case == "bool_mask":
        assert torch.equal(out[:, :, 4], torch.zeros_like(out[:, :, 4]))


def test_decomposition_is_explained_and_serialised():
    from torchfl.planner.plan import Plan

    plan, _out, _ref = _run(SDPA(causal=True, gqa=True), _qkv(), "DSP-M4")
    text = " ".join(plan.explain().split())   # unwrapped
    assert "Decomposed: scaled_dot_product_attention (aten.scaled_dot_product_attention.default) by " \
           "core:decompositions[0] sdpa_gemm_softmax into" in text
    assert "(bmm)" in text and "(_softmax)" in text
    assert "decomposed scaled_dot_product_attention.default [scaled_dot_product_attention]" in text
    assert "tril" in text and "Folded on the host" in text          # the causal mask: once, on the host
    again = Plan.from_json(plan.to_json())
    assert again.decomposed == plan.decomposed and again.to_json() == plan.to_json()


def test_attention_unit_limits_stand_never_a_decomposition():
    """NPU-V2's unit runs 1/2/4/8 heads: 12 heads is the seed's error, not a rewrite."""
    from torchfl.planner.errors import UnsupportedAttention

    with pytest.raises(UnsupportedAttention, match="MultiheadAttention with num_heads=12 not supported on NPU-V2"):
        plan_module(SDPA(), _qkv(heads=12, kv=12), chip=_target("NPU-V2"), precision="float16")


@pytest.mark.parametrize("module, with_mask", [(SDPA(gqa=True), False), (SDPA(causal=True, gqa=True), False),
                                               (RepeatKV(), True)])
def test_npu_v3_grouped_query_attention_on_the_unit(module, with_mask):
    q, k, v = _qkv(heads=8, kv=2)
    inputs = (q, k, v) + ((torch.randn(2, 1, 9, 9, generator=torch.Generator().manual_seed(1)),) if with_mask else ())
    plan, out, ref = _run(module, inputs, "NPU-V3")
    assert not plan.fallbacks and not plan.decomposed
    (att,) = [s for s in plan.steps if s.kernel == "attention"]
    assert plan.values[att.inputs[1]].shape == (2, 2, 9, 16)        # K read grouped, never repeated
    assert not [s for s in plan.steps if s.kernel in ("expand", "copy")]
    torch.testing.assert_close(out, ref, **FP16)


def test_repeat_kv_folded_on_a_rank_4_chip():
    q, k, v = _qkv(heads=8, kv=2)
    plan, out, ref = _run(RepeatKV(), (q, k, v, torch.randn(2, 1, 9, 9, generator=torch.Generator().manual_seed(1))), "DSP-M4")
    assert not plan.fallbacks and len(plan.decomposed) == 1
    torch.testing.assert_close(out, ref, **FP16)


EXTRA = """pack: {name: extra, version: 0.0.1}
decompositions:
  - name: addmm_split
    op: aten.addmm.default
    args: {self: tensor, mat1: tensor, mat2: tensor, beta: scalar, alpha: scalar}
    defaults: {beta: 1, alpha: 1}
    parts:
      - {id: mm, op: aten.mm.default, args: [mat1, mat2]}
      - {id: o, op: aten.add.Tensor, args: [mm, self]}
  - name: sdpa_flip
    op: aten.scaled_dot_product_attention.default
    args: {query: tensor, key: tensor, value: tensor}
    parts:
      - {id: c, op: aten.flip.default, args: [query, "[2]"]}
"""


def _extra():
    from torchfl.rules.compile import load_pack_text

    return (load_pack_text(EXTRA, "extra.yaml"),)


def test_decomposition_loses_to_a_direct_kernel_on_price():
    class AddMM(torch.nn.Module):
        def forward(self, b, x, w):
            return torch.addmm(b, x, w)

    g = torch.Generator().manual_seed(5)
    # x scaled by 1/sqrt(K): O(1) outputs, the scale FP16's tolerance is stated for (unscaled
    # randn gave |out| ~ 6 and, unseeded, failed a run in the fp16 rounding of its inputs)
    inputs = (torch.randn(16, generator=g), torch.randn(8, 32, generator=g) / 32 ** 0.5,
              torch.randn(32, 16, generator=g))
    plan, out, ref = _run(AddMM(), inputs, "NPU-V3",
                          extra=_extra())
    assert not plan.decomposed
    lost = [r for r in plan.rejected if r.kernel == "decomposed (addmm_split)"]
    assert lost and " vs " in lost[0].reasons[0] and "e-0" not in lost[0].reasons[0] and "for matmul" in lost[0].reasons[0]
    torch.testing.assert_close(out, ref, **FP16)


def test_decomposition_refused_when_a_part_would_fall_back():
    """The first decomposition that applies is the one priced (pack order): after core's, the
    extra pack's sdpa_flip is never tried; before it, its flip part has no kernel (no rule),
    so the op falls back whole, with the reason."""
    tgt = _target("DSP-M4")
    after = Target.of(tgt.hcd, bundled_packs() + _extra())
    assert len(plan_module(SDPA(), _qkv(kv=4), chip=after, precision="float16").decomposed) == 1
    before = Target.of(tgt.hcd, _extra() + bundled_packs())
    plan = plan_module(SDPA(), _qkv(kv=4), chip=before, precision="float16")
    assert not plan.decomposed and [f.op for f in plan.fallbacks] == ["aten.scaled_dot_product_attention.default"]
    (lost,) = [r for r in plan.rejected if r.kernel == "decomposed (sdpa_flip)"]
    assert "would fall back" in lost.reasons[0] and "flip" in lost.reasons[0]


def test_attention_unit_sequence_limit_stands_never_a_decomposition():
    """NPU-V2's unit takes sequences up to 2048: 2049 keys is the HCD's error, not a rewrite."""
    from torchfl.planner.errors import HardConstraintError

    with pytest.raises(HardConstraintError, match="compute_units.attention.max_sequence_length"):
        plan_module(SDPA(), _qkv(heads=4, kv=4, lq=1, lk=2049, d=8), chip=_target("NPU-V2"), precision="float16")
