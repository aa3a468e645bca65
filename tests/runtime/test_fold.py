"""Constant folding: a node no kernel takes, whose value depends on no user input, is
computed once on the host and kept on the chip (a ``fold`` step), not a per-call CPU
fallback. Real torch.compile, real planner, real kernels."""
import logging

import pytest
import torch
from torch import nn

from tests.runtime.models import rel_err

from torchfl.runtime.backend import recording

V3 = {"chip": "NPU-V3", "precision": "float16"}
FP16_TOL = 1e-2   # fp16 storage, fp32 accumulation, relative to max |ref|


class BufferScale(nn.Module):
    """x * flip(buffer) + arange: flip has no kernel, but neither it nor arange reads x."""

    def __init__(self, n=16):
        super().__init__()
        self.register_buffer("w", torch.linspace(0.1, 1.0, n))

    def forward(self, x):
        ramp = torch.arange(x.shape[-1], dtype=torch.float32) / 16
        return x * torch.flip(self.w, [0]) + ramp


class InputFlip(nn.Module):
    """flip of the input itself: input-dependent, so a real (per-call) fallback."""

    def forward(self, x):
        return torch.flip(x * 2, [-1])


def _run(model, x, **opts):
    c = torch.compile(model, backend="torchfl", options={**V3, **opts})
    with torch.no_grad(), recording(analyze=True) as rec:
        y = c(x)
    return c, y, rec


def test_input_independent_nodes_fold_instead_of_falling_back():
    m = BufferScale().eval()
    x = torch.randn(4, 16)
    c, y, rec = _run(m, x, strict=True)          # strict: folding is not a fallback
    assert rel_err(y, m(x)) < FP16_TOL
    (_cg, plan, record), = rec.entries
    assert not plan.fallbacks
    folded_ops = {f.op for f in plan.folded}
    assert "aten.flip.default" in folded_ops and "aten.arange.start_step" in folded_ops
    s = plan.summary
    assert s.folded == len(plan.folded) and s.nodes_on_chip + s.folded == s.nodes_total
    assert "input-independent nodes folded" in s.headline(plan.chip)
    folds = [st for st in plan.steps if st.kind == "fold"]
    assert folds and all(st.static for st in folds)
    # route accounting of the measured run names the fold, never "CPU fallback"
    routes = {k for per_op in record.routes.values() for k in per_op}
    assert "host fold (once)" in routes and "CPU fallback" not in routes
    text = plan.explain()
    assert "Folded on the host" in text and "aten.flip.default" in text
    assert "host (folded)" in plan.explain("dot")
    from torchfl.planner.plan import Plan

    assert Plan.from_json(plan.to_json()) == plan      # folded nodes survive the JSON round trip


def test_folded_value_is_computed_once_and_again_when_its_buffer_changes():
    m = BufferScale().eval()
    x = torch.randn(4, 16)
    c = torch.compile(m, backend="torchfl", options=V3)
    with torch.no_grad():
        c(x)
        y1 = c(x)                           # the cached static state
        assert rel_err(y1, m(x)) < FP16_TOL
        m.w.mul_(3.0)                       # in place: same tensor, new version
        y2 = c(x)
        assert rel_err(y2, m(x)) < FP16_TOL
        assert rel_err(y2, y1) > 0.1        # the folded flip was recomputed


def test_input_dependent_node_is_a_logged_fallback(caplog):
    m = InputFlip()
    x = torch.randn(3, 8)
    with caplog.at_level(logging.WARNING, logger="torchfl"):
        _c, y, rec = _run(m, x)
    (_cg, plan, _r), = rec.entries
    assert [f.op for f in plan.fallbacks] == ["aten.flip.default"] and not plan.folded
    assert "[SME] Fallback to CPU: aten::flip" in caplog.text
    assert rel_err(y, m(x)) < FP16_TOL
    torch._dynamo.reset()
    with pytest.raises(RuntimeError, match="flip") as err:
        _run(m, x, strict=True)
    assert "strict" in str(err.value).lower()


def test_debug_log_names_folds(monkeypatch, caplog):
    monkeypatch.setenv("TORCH_FL_DEBUG", "1")
    with caplog.at_level(logging.DEBUG, logger="torchfl"):
        _run(BufferScale().eval(), torch.randn(2, 16))
    assert "[SME] Fold on host: aten::flip" in caplog.text
    assert "Fallback to CPU" not in caplog.text


def test_analyze_counts_folds_like_the_plan_prices_them(monkeypatch):
    import torchfl

    monkeypatch.setenv("COLUMNS", "200")      # the kernel cell whole on one line (it wraps at 100)

    m = BufferScale().eval()
    c = torch.compile(m, backend="torchfl", options=V3)
    _text, (an,) = torchfl.explain(c, torch.randn(4, 16), analyze=True, return_analysis=True)
    assert any(s.kind == "fold" for s in an.steps)
    for s in an.steps:
        assert int(round(s.predicted_bytes)) == s.measured_bytes, (s.index, s.kind, s.label)
    assert "host (torch, folded)" in an.render()
