"""explain / explain analyze: the plan as text; executed, predicted beside measured."""
import pytest
import torch

import torchfl
from tests.runtime.models import SmallCNN, TwoGraphs, seeded

V3 = {"chip": "NPU-V3", "precision": "float16"}


def test_explain_compiled_model_text():
    m = seeded(SmallCNN)
    x = torch.randn(1, 3, 16, 16)
    c = torch.compile(m, backend="torchfl", options=V3)
    text = torchfl.explain(c, x)
    assert "NPU-V3" in text and "fallbacks to CPU" in text


def test_explain_plain_module_with_chip():
    m = seeded(SmallCNN)
    text = torchfl.explain(m, torch.randn(1, 3, 16, 16), chip="NPU-V3", precision="float16")
    assert "NPU-V3" in text


def test_explain_needs_a_chip_for_a_plain_module():
    with pytest.raises(ValueError, match="chip="):
        torchfl.explain(seeded(SmallCNN), torch.randn(1, 3, 16, 16))


@pytest.mark.parametrize("compiled", [True, False])
def test_analyze_predicted_bytes_equal_measured_on_every_step(compiled):
    m = seeded(SmallCNN)
    x = torch.randn(2, 3, 16, 16)
    target = torch.compile(m, backend="torchfl", options=V3) if compiled else m
    kw = {} if compiled else dict(chip="NPU-V3", precision="float16")
    text, analyses = torchfl.explain(target, x, analyze=True, return_analysis=True, **kw)
    assert analyses
    for an in analyses:
        assert len(an.steps) == len(an.plan.steps)        # every step executed and measured
        for s in an.steps:
            assert int(round(s.predicted_bytes)) == s.measured_bytes, (s.index, s.kernel, s.label)
            assert s.wall_s > 0
        # route accounting was counted during the run: every captured node is accounted for
        counted = sum(n for per_op in an.routes.values() for n in per_op.values())
        assert counted == an.plan.summary.nodes_total
    assert "equal on every step" in text
    assert "Largest predicted-vs-simulated time error" in text or "equals the time simulated" in text
    assert "Routes (per ATen op, counted during the run)" in text
    assert "aten.convolution.default" in text or "aten.conv2d.default" in text
    assert max(len(line) for line in text.splitlines()) <= 120, "explain text wider than 120 columns"
    # the demo's short table: per-call steps only (run-once parameter casts are not a call's cost)
    an = analyses[0]
    per_call = {s.index for s in an.steps if not an.static(s)}
    assert per_call and len(per_call) < len(an.steps)
    short = an.render(only=per_call, omitted_note="...")
    rows = [ln.split()[0] for ln in short.splitlines() if ln[:5].strip().rstrip("*").isdigit()]
    assert rows and all(not r.endswith("*") for r in rows) and len(rows) == len(per_call)


def test_analyze_each_graph_of_a_graph_break():
    m = seeded(TwoGraphs)
    c = torch.compile(m, backend="torchfl", options=V3)
    text, analyses = torchfl.explain(c, torch.randn(4, 16), analyze=True, return_analysis=True)
    assert len(analyses) == 2
    assert text.count("EXPLAIN ANALYZE graph") == 2


class TopK(torch.nn.Module):
    """kthvalue has no kernel: a multi-output CPU fallback (values and indices; topk has one since core 1.14.0)."""

    def forward(self, x):
        v, i = torch.kthvalue(x * 2, 3, dim=-1)
        return v * 3, i


def test_multi_output_fallback_is_priced_with_every_output():
    x = torch.randn(4, 64)
    _text, (an,) = torchfl.explain(TopK(), x, chip="NPU-V3", precision="float16", analyze=True,
                                   return_analysis=True)
    (fb,) = [s for s in an.steps if s.kind == "fallback"]
    assert int(round(fb.predicted_bytes)) == fb.measured_bytes
    # inputs read (4x64 fp16) plus both outputs written (4 each)
    assert fb.measured_bytes > 4 * 64 * 2 + 4 * 2
