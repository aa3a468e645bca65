"""A node whose own rule is refused for a real reason while a fusion covers it: the selection
said ``no feasible cover reaches node linear`` (a SelectionError, a traceback in the CLI)
though the fusion covers it. Now the fusion is taken; and where no cover exists, the error
names the node, its op, shapes and dtypes, every rule tried and why it was refused, and what
the user can do."""

from __future__ import annotations

import pytest
import torch

from torchfl.hcd import load_hcd_text
from torchfl.planner.select import CoverProblem, Option, SelectionError, select
from torchfl.resources import bundled_path
from torchfl.rules import load_pack_text

CORE = (bundled_path("rules") / "core.yaml").read_text()
LINEAR_RULE = """  - op: aten.linear.default
    kernel: linear
    args: {input: tensor, weight: tensor, bias: "tensor?"}
    requires: {dtypes: [float32, float16, bfloat16], layouts: none}"""
# a vendor pack whose plain linear kernel is certified on npu_v3 only; its linear -> gelu fusion is not restricted
RESTRICTED = LINEAR_RULE.replace("layouts: none}", "layouts: none, device_types: [npu_v3]}")


def _target():
    from torchfl.planner.target import Target

    assert CORE.count(LINEAR_RULE) == 1
    text = (bundled_path("hcd_registry") / "npu_v3.hcd").read_text()
    # a real variant: the next chip of the family, same numbers, another device type
    hcd = load_hcd_text(text.replace("name: NPU-V3", "name: NPU-V4X").replace("device_type: npu_v3",
                                                                            "device_type: npu_v4"), "npu_v4x.hcd")
    pack = load_pack_text(CORE.replace(LINEAR_RULE, RESTRICTED), "core.yaml")
    return Target.of(hcd, [pack])


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def test_a_node_only_a_contiguous_fusion_covers_is_planned():
    # was: SelectionError: no feasible cover reaches node a
    problem = CoverProblem({"a": ("x",), "b": ("a",), "c": ("b",)}, {"x": "AB"}, (("c", "AB"),),
                           (Option("f", ("a", "b"), ("x",), ("AB",), "AB", 1.0),
                            Option("s", ("c",), ("b",), ("AB",), "AB", 1.0)), lambda v, h, n: 1.0)
    sel = select(problem)
    assert [o.key for o in sel.chosen] == ["f", "s"] and sel.cost == 2.0


def test_no_option_past_a_node_names_it():
    problem = CoverProblem({"a": ("x",), "b": ("a",)}, {"x": "AB"}, (("b", "AB"),),
                           (Option("f", ("a",), ("x",), ("AB",), "AB", 1.0),
                            Option("g", ("b",), ("a",), ("BA",), "BA", 1.0)), lambda v, h, n: float("inf"))
    with pytest.raises(SelectionError, match="no feasible cover reaches node b") as info:
        select(problem)
    assert info.value.node == "b" and info.value.options == ("g",)


def test_refused_linear_rule_plans_the_fusion_and_runs_right():
    from torchfl.planner import plan_module
    from torchfl.runtime.executor import Executor

    torch.manual_seed(0)
    model, x = MLP().eval(), torch.randn(8, 32)
    plan = plan_module(model, (x,), chip=_target(), precision="float16")  # SelectionError before
    kernels = [s.kernel for s in plan.steps if s.kind != "cast"]
    assert "linear_gelu" in kernels, kernels
    # fc2 has no gelu after it: its own rule is refused on npu_v4, so it runs on the CPU, said why
    assert [f.node for f in plan.fallbacks] == ["linear_1"], plan.fallbacks
    assert "npu_v4" in plan.fallbacks[0].reason and "device types" in plan.fallbacks[0].reason
    with torch.no_grad():
        got = Executor(plan)(x)
        want = model(x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)   # float16 storage, fp32 accumulation


def test_no_cover_names_the_node_its_refusals_and_the_fix():
    """The real graph, candidates and selection of the NPU-V4X MLP, with the linear -> gelu
    fusion withdrawn (as when a group cannot be placed): fc1's only cover is gone."""
    from torchfl.planner.candidates import Generator
    from torchfl.planner.capture import capture_module
    from torchfl.planner.cost import Pricer
    from torchfl.planner.graph import build_ir
    from torchfl.planner.plan import identity_layout
    from torchfl.planner.select_explain import no_cover

    target = _target()
    captured = capture_module(MLP().eval(), (torch.randn(8, 32),))
    ir = build_ir(captured, "float16")
    cands = Generator(ir, target.hcd, target.packs, target.model, Pricer.for_chip(target.model)).run()
    options = tuple(o for o in cands.options if len(o.nodes) == 1)
    fixed = {name: identity_layout(info.rank) for name, _k, _t, info in ir.placeholders}
    fixed.update({c: fixed[src] for c, src, _to in ir.casts})
    outputs = tuple((ir.fx_to_ir.get(o, o), identity_layout(ir.values[ir.fx_to_ir.get(o, o)].rank))
                    for o in ir.outputs)
    problem = CoverProblem({n.name: n.inputs for n in ir.nodes.values()}, fixed, outputs, options,
                           lambda v, h, n: 0.0)
    with pytest.raises(SelectionError) as info:
        select(problem)
    err = no_cover(info.value, ir, cands, target.name)
    text = str(err)
    first = text.splitlines()[0]
    assert first.startswith("cannot plan node linear (aten.linear.default: ") and " on NPU-V4X: " in first, first
    assert "[8, 32] float16" in first and "-> [8, 64] float16" in first, first    # shapes and dtypes
    assert "chip.device_type" in first and "torch.compiler.disable" in first, first   # the two fixes
    assert "registry support aten.linear.default" in first
    tried = [line for line in text.splitlines()[1:] if line.startswith("  tried kernel linear")]
    assert tried and "npu_v4" in tried[0] and "npu_v3" in tried[0], text
    assert err.kind == "RuntimeError" and err.node == "linear" and err.op == "aten.linear.default"
