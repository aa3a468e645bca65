"""core 1.22.0's transposed-operand fusions in real plans: HF attention's ``q @ k.transpose(-1, -2)``
(export's permute), the sdpa_gemm_softmax decomposition's transpose of K (DSP-M4 has no attention
unit), training's mm(t(x), g) and addmm(b, x, t(w)) become one bmm / matmul reading the operand
in place (``trans_a`` / ``trans_b``), priced as the GEMM alone: the layout_transform copy is gone.
A clone between (a real copy), an expand that broadcasts, and a transpose read elsewhere keep
their copy. Numerics through torch.compile (backend torchfl) against eager torch, tolerances as
tests/planner/test_attention_bshd_plan.py: float32 1e-5 of the largest magnitude, the float16
policy 2e-3; training gradients as tests/runtime/test_training.py (5e-2, fp16 storage)."""
import copy

import pytest
import torch
from torch import nn

from torchfl.planner import plan_module, plan_training
from torchfl.runtime.backend import recording


class Scores(nn.Module):
    """HF eager attention: q @ k^T (torch.matmul of 4-D tensors), scale, softmax, @ v."""

    def __init__(self, mode="plain"):
        super().__init__()
        self.mode = mode

    def forward(self, q, k, v):
        kt = k.transpose(-1, -2)
        if self.mode == "clone":
            kt = kt.contiguous()                    # a real copy: not folded
        s = torch.matmul(q, kt) * 0.25
        out = torch.matmul(s.softmax(-1), v)
        return (out, kt * 2) if self.mode == "leak" else out


def _gemms(plan):
    return [(s.kind, s.kernel, bool(s.attrs.get("trans_a")), bool(s.attrs.get("trans_b")))
            for s in plan.steps if s.kernel in ("bmm", "matmul")]


def _copies(plan):
    return [s for s in plan.steps if s.kernel in ("layout_transform", "copy")]


def _qkv(b=2, h=4, lq=8, lk=12, d=16, kv_heads=None):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, h, lq, d, generator=g), torch.randn(b, kv_heads or h, lk, d, generator=g),
            torch.randn(b, kv_heads or h, lk, d, generator=g))


def test_q_at_k_transposed_reads_k_in_place():
    plan = plan_module(Scores().eval(), _qkv(), chip="TFL-X1")
    assert ("fused", "bmm", False, True) in _gemms(plan), _gemms(plan)
    assert not _copies(plan), [(s.kernel, s.nodes) for s in _copies(plan)]
    fused = next(s for s in plan.steps if s.kind == "fused" and s.kernel == "bmm")
    assert fused.nodes[0] == "permute" and fused.inputs[1] == "k"      # K as stored: [B, H, L, D]


def test_the_fold_removes_exactly_the_copy():
    """The bmm reading K^T in place is priced as the bmm of the copy it replaces."""
    q, k, v = _qkv(lk=40)
    folded = plan_module(Scores().eval(), (q, k, v), chip="TFL-X1")
    copied = plan_module(Scores("clone").eval(), (q, k, v), chip="TFL-X1")
    fb = next(s for s in folded.steps if s.kind == "fused" and s.kernel == "bmm")
    cb = next(s for s in copied.steps if s.kernel == "bmm" and s.outputs == fb.outputs)
    assert fb.predicted_time_s == pytest.approx(cb.predicted_time_s) and fb.tile == cb.tile
    assert _copies(copied) and copied.summary.predicted_time_s > folded.summary.predicted_time_s


@pytest.mark.parametrize("mode", ["clone", "leak"])
def test_a_real_copy_or_a_transpose_read_elsewhere_is_not_folded(mode):
    plan = plan_module(Scores(mode).eval(), _qkv(), chip="TFL-X1")
    assert not any(ta or tb for _k, _n, ta, tb in _gemms(plan)), _gemms(plan)


def test_an_expand_that_broadcasts_is_not_folded():
    """One K head for four query heads (matmul broadcasts K): the reshape after the expand is
    a copy torch makes, and the transpose stays apart from the bmm."""
    plan = plan_module(Scores().eval(), _qkv(kv_heads=1), chip="TFL-X1")
    assert not any(tb for _k, _n, _ta, tb in _gemms(plan)), _gemms(plan)


@pytest.mark.parametrize("precision,tol", [(None, 1e-5), ("float16", 2e-3)])
@pytest.mark.parametrize("mode,kv_heads", [("plain", None), ("plain", 1), ("clone", None)])
def test_compiled_scores_match_torch(precision, tol, mode, kv_heads):
    torch.manual_seed(0)
    args = _qkv(kv_heads=kv_heads)
    args[1][0, 0, 3, 5] = float("nan")             # NaN where torch has it: batch 0's rows
    m = Scores(mode).eval()
    opts = {"chip": "TFL-X1", **({"precision": precision} if precision else {})}
    with torch.no_grad(), recording() as rec:
        want = m(*args)
        got = torch.compile(m, backend="torchfl", options=opts, dynamic=False)(*args)
    folded = any(s.attrs.get("trans_b") for _cg, p, _r in rec.entries for s in p.steps)
    assert folded == (mode == "plain" and kv_heads is None)
    assert torch.equal(got.isnan(), want.isnan())
    fin = want.isfinite()
    assert float((got[fin] - want[fin]).abs().max()) <= tol * float(want[fin].abs().max())


class Sdpa(nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_sdpa_decomposition_reads_k_in_place_on_a_chip_without_attention_unit():
    """DSP-M4 serves sdpa as sdpa_gemm_softmax: its transpose of K folds into q k^T's bmm."""
    args = _qkv(b=1, lq=1, lk=24)                  # a decode step: one query
    plan = plan_module(Sdpa().eval(), args, chip="DSP-M4", precision="float16")
    assert ("fused", "bmm", False, True) in _gemms(plan), _gemms(plan)
    assert not [s for s in plan.steps if s.kernel == "layout_transform"]
    with torch.no_grad():
        want = Sdpa()(*args)
        got = torch.compile(Sdpa(), backend="torchfl", dynamic=False,
                            options={"chip": "DSP-M4", "precision": "float16"})(*args)
    assert float((got - want).abs().max()) <= 2e-3 * float(want.abs().max())


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))


def test_training_weight_gradients_read_the_activation_in_place():
    """AOTAutograd's backward: mm(t(g), x) for each weight gradient, mm(g, t(t(w))) for the
    input gradient, and the forward's addmm(b, x, t(w)): the transposes fold into the GEMMs
    (a transposed weight the forward saves for the backward keeps its copy)."""
    fw, bw = plan_training(_mlp().train(), (torch.randn(8, 32),), chip="TFL-X1")
    assert ("fused", "matmul", False, True) in _gemms(fw), _gemms(fw)
    assert _gemms(bw).count(("fused", "matmul", True, False)) == 2, _gemms(bw)
    assert ("fused", "matmul", False, True) in _gemms(bw), _gemms(bw)
    feeding = {i for s in bw.steps if s.kernel == "matmul" for i in s.inputs}
    assert not [s for s in bw.steps if s.kernel == "layout_transform" and set(s.outputs) & feeding]


def test_compiled_training_gradients_match_torch():
    from tests.runtime.models import rel_err

    eager = _mlp().train()
    ours = copy.deepcopy(eager)
    x = torch.randn(8, 32)
    compiled = torch.compile(ours, backend="torchfl", options={"chip": "NPU-V3", "precision": "float16"})
    with recording() as rec:
        compiled(x).pow(2).mean().backward()
    eager(x).pow(2).mean().backward()
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        assert rel_err(p.grad, q.grad) < 5e-2, (name, rel_err(p.grad, q.grad))
    plans = [p for _cg, p, _r in rec.entries]
    assert any(s.kind == "fused" and s.attrs.get("trans_a") for p in plans for s in p.steps)
