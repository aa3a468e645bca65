"""The rule pack's attention_bshd fusion: the transposes a model makes around attention
(q, k, v viewed per head [B, L, H, D] and transposed to [B, H, L, D]; the output transposed
back) are folded into the attention kernel (``bshd``), so no layout_transform step is left
around it; a transpose whose output is read elsewhere keeps the ops apart. Numerics through
torch.compile against eager torch: float32 on TFL-X1's float32 unit within 1e-5 of the largest
magnitude; the float16 policy within 2e-3 (fp16 rounding of q, k, v, p and o, fp32 sums)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchfl.planner import plan_module


class SelfAttention(nn.Module):
    """HF-style self-attention: projections viewed per head and transposed, SDPA, back."""

    def __init__(self, dim=64, heads=4, causal=False, leak=False):
        super().__init__()
        self.h, self.causal, self.leak = heads, causal, leak
        self.qkv = nn.ModuleList(nn.Linear(dim, dim) for _ in range(3))
        self.o = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        b, l, e = x.shape
        q, k, v = (f(x).view(b, l, self.h, e // self.h).transpose(1, 2) for f in self.qkv)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        y = self.o(a.transpose(1, 2).reshape(b, l, e))
        return (y, q * 2) if self.leak else y


def _kernels(plan):
    return [(s.kind, s.kernel, (s.attrs or {}).get("bshd")) for s in plan.steps if s.kind in ("kernel", "fused")]


def test_transposes_fold_into_attention():
    plan = plan_module(SelfAttention().eval(), (torch.randn(2, 16, 64),), chip="TFL-X1")
    ks = _kernels(plan)
    assert ("fused", "attention", True) in ks, ks
    assert not [k for k in ks if k[1] == "layout_transform"], ks
    step = next(s for s in plan.steps if s.kernel == "attention")
    assert "strided rows" in (step.tile or {}).get("notes", "")


def test_a_transpose_read_elsewhere_keeps_the_ops_apart():
    plan = plan_module(SelfAttention(leak=True).eval(), (torch.randn(2, 16, 64),), chip="TFL-X1")
    ks = _kernels(plan)
    assert ("kernel", "attention", False) in ks and ("fused", "attention", True) not in ks, ks


@pytest.mark.parametrize("precision,tol", [(None, 1e-5), ("float16", 2e-3)])
@pytest.mark.parametrize("mode", ["plain", "causal", "mask"])
def test_compiled_attention_with_folded_transposes_matches_torch(precision, tol, mode):
    torch.manual_seed(0)
    m = SelfAttention(causal=mode == "causal").eval()
    x = torch.randn(2, 24, 64)
    args = (x,) if mode != "mask" else (x, torch.rand(2, 1, 24, 24) > 0.2)
    opts = {"chip": "TFL-X1", **({"precision": precision} if precision else {})}
    with torch.no_grad():
        want = m(*args)
        got = torch.compile(m, backend="torchfl", options=opts)(*args)
    assert float((got - want).abs().max()) <= tol * float(want.abs().max())


def test_analyze_counts_the_bytes_the_plan_predicts_for_the_folded_attention():
    """explain --analyze: every step's measured bytes equal its predicted bytes, the fused
    attention (bshd) included."""
    import torchfl

    m = SelfAttention(causal=True).eval()
    x = torch.randn(2, 24, 64)
    with torch.no_grad():
        _text, analyses = torchfl.explain(m, x, chip="TFL-X1", precision="float16", analyze=True,
                                          return_analysis=True)
    kernels = [s.kernel for an in analyses for s in an.steps]
    assert "attention" in kernels and "layout_transform" not in kernels
    for an in analyses:
        for s in an.steps:
            assert int(round(s.predicted_bytes)) == s.measured_bytes, (s.index, s.kernel, s.label)
