"""The fusion group finder (torchfl.rules.groups) on small hand-built FX graphs of ATen ops:
which groups form, which node each step binds, the orientation of commutative operands,
and the groups that must not form (an intermediate value read outside the group)."""

from __future__ import annotations

import operator
import textwrap

import pytest
import torch

from torchfl.resources import bundled_path
from torchfl.rules import check_pack_text, load_pack, load_pack_text
from torchfl.rules.groups import FusionIndex, FxGraphView, find_groups, oriented

aten = torch.ops.aten
CORE = load_pack(bundled_path("rules") / "core.yaml")

DAG_PACK = load_pack_text(textwrap.dedent("""\
    pack: {name: dag, version: 1.0.0}
    rules:
      - {op: aten.relu.default, kernel: relu, args: {self: tensor}, bind: {a: self}}
      - {op: aten.neg.default, kernel: neg, args: {self: tensor}, bind: {a: self}}
      - {op: aten.sigmoid.default, kernel: sigmoid, args: {self: tensor}, bind: {a: self}}
      - {op: aten.add.Tensor, kernel: add, args: {self: tensor, other: any, alpha: scalar}, defaults: {alpha: 1},
         bind: {a: self, b: other}}
      - {op: aten.mul.Tensor, kernel: mul, args: {self: tensor, other: any}, bind: {a: self, b: other}}
    fusions:
      - name: relu_add_neg          # relu(x) + neg(y), on either side of the add
        kernel: add
        pattern:
          - {id: r, op: aten.relu.default}
          - {id: add, op: aten.add.Tensor, input: self, commutative: [self, other]}
          - {id: n, op: aten.neg.default, into: add, input: other}
        bind: {a: r.self, b: n.self}
      - name: nested                # relu(relu(x) * sigmoid(neg(y))): an into-step that has its own
        kernel: mul                 # into-step, and a from-step after them
        pattern:
          - {id: r, op: aten.relu.default}
          - {id: m, op: aten.mul.Tensor, input: self}
          - {id: s, op: aten.sigmoid.default, into: m, input: other}
          - {id: n, op: aten.neg.default, into: s, input: self}
          - {id: act, op: aten.relu.default, from: m}
        bind: {a: r.self, b: n.self}
    """))


class G:
    """A tiny FX graph builder: ``g.op(aten.relu.default, x)`` appends a call."""

    def __init__(self, *inputs):
        self.graph = torch.fx.Graph()
        self.inputs = [self.graph.placeholder(n) for n in inputs]

    def op(self, target, *args, **kwargs):
        return self.graph.call_function(target, args, kwargs)

    def item(self, node, i):
        return self.graph.call_function(operator.getitem, (node, i))

    def done(self, *outs):
        self.graph.output(outs[0] if len(outs) == 1 else outs)
        return FxGraphView(self.graph)


def conv_bn(g, x):
    w, b, bw, bb, rm, rv = g.inputs[1:7]
    conv = g.op(aten.conv2d.default, x, w, b)
    bn = g.op(aten._native_batch_norm_legit_no_training.default, conv, bw, bb, rm, rv, 0.1, 1e-5)
    return conv, bn, g.item(bn, 0)


def named(groups, name):
    return [gr for gr in groups if gr.fusion.name == name]


@pytest.mark.parametrize("residual_first", [False, True])
def test_residual_add_forms_on_either_side_with_the_swap_recorded(residual_first):
    g = G("x", "w", "b", "bw", "bb", "rm", "rv")
    x = g.inputs[0]
    conv, bn, y = conv_bn(g, x)
    add = g.op(aten.add.Tensor, *((x, y) if residual_first else (y, x)))
    act = g.op(aten.relu.default, add)
    groups = find_groups(CORE, g.done(act))
    assert {gr.fusion.name for gr in groups} == {"conv2d_bn", "conv2d_bn_add_relu"}
    (group,) = named(groups, "conv2d_bn_add_relu")
    assert group.nodes == (conv.name, bn.name, add.name, act.name) and group.output == act.name
    assert group.node("add") == add.name
    assert group.swaps == ((("add", "self", "other"),) if residual_first else ())
    # the binding reads the pattern's order: add.other is the residual x on both graphs
    call = {"self": add.args[0], "other": add.args[1], "alpha": 1}
    assert oriented(call, "add", group.swaps)["other"] is x


def test_an_intermediate_read_outside_the_group_stops_it():
    g = G("x", "w", "b", "bw", "bb", "rm", "rv")
    x = g.inputs[0]
    conv, bn, y = conv_bn(g, x)
    act = g.op(aten.relu.default, g.op(aten.add.Tensor, y, x))
    other = g.op(aten.neg.default, conv)          # the conv output is read outside
    assert find_groups(CORE, g.done(act, other)) == []
    g = G("x", "w", "b", "bw", "bb", "rm", "rv")
    conv, bn, y = conv_bn(g, g.inputs[0])
    act = g.op(aten.relu.default, g.op(aten.add.Tensor, y, g.inputs[0]))
    groups = find_groups(CORE, g.done(act, y))     # the batch-norm output is a graph output
    assert [gr.fusion.name for gr in groups] == ["conv2d_bn"]


def test_a_value_in_both_operands_is_no_residual():
    g = G("x", "w", "b", "bw", "bb", "rm", "rv")
    conv, bn, y = conv_bn(g, g.inputs[0])
    act = g.op(aten.relu.default, g.op(aten.add.Tensor, y, y))
    assert [gr.fusion.name for gr in find_groups(CORE, g.done(act))] == ["conv2d_bn"]


def test_quantised_add_binds_the_second_dequantize_and_only_from_self():
    g = G("a", "b")
    dq = quantized_dq()
    da = g.op(dq, g.inputs[0], 0.1, 0, -128, 127, torch.int8)
    db = g.op(dq, g.inputs[1], 0.2, 0, -128, 127, torch.int8)
    add = g.op(aten.add.Tensor, da, db)
    act = g.op(aten.relu.default, add)
    q = g.op(quantized_q(), act, 0.3, 0, -128, 127, torch.int8)
    groups = find_groups(CORE, g.done(q))
    (group,) = groups     # from db (feeding `other`) nothing forms: that add is not commutative
    assert group.fusion.name == "dq_add_relu_q"
    assert dict(group.steps) == {"aq": da.name, "add": add.name, "act": act.name, "q": q.name, "bq": db.name}
    assert group.nodes == (da.name, db.name, add.name, act.name, q.name) and group.swaps == ()
    g = G("a")
    da = g.op(dq, g.inputs[0], 0.1, 0, -128, 127, torch.int8)
    q = g.op(quantized_q(), g.op(aten.relu.default, g.op(aten.add.Tensor, da, da)), 0.3, 0, -128, 127, torch.int8)
    assert find_groups(CORE, g.done(q)) == []   # one dequantize in both operands: no second operand


def quantized_dq():
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed

    return torch.ops.quantized_decomposed.dequantize_per_tensor.default


def quantized_q():
    quantized_dq()
    return torch.ops.quantized_decomposed.quantize_per_tensor.default


@pytest.mark.parametrize("relu_first", [False, True])
def test_into_a_commutative_step_takes_the_operand_the_chain_did_not(relu_first):
    g = G("x", "y")
    r = g.op(aten.relu.default, g.inputs[0])
    n = g.op(aten.neg.default, g.inputs[1])
    add = g.op(aten.add.Tensor, *((r, n) if relu_first else (n, r)))
    (group,) = find_groups(DAG_PACK, g.done(add))
    assert dict(group.steps) == {"r": r.name, "add": add.name, "n": n.name}
    assert group.swaps == (() if relu_first else (("add", "self", "other"),))


def test_nested_into_steps_and_a_from_step_after_them():
    g = G("x", "y")
    r = g.op(aten.relu.default, g.inputs[0])
    s = g.op(aten.sigmoid.default, g.op(aten.neg.default, g.inputs[1]))
    m = g.op(aten.mul.Tensor, r, s)
    act = g.op(aten.relu.default, m)
    groups = find_groups(DAG_PACK, g.done(act))
    (group,) = named(groups, "nested")
    assert group.output == act.name and set(group.nodes) == {r.name, s.name, m.name, act.name, s.args[0].name}
    assert [group.node(k) for k in ("r", "m", "s", "act")] == [r.name, m.name, s.name, act.name]


def test_views_between_steps_are_covered():
    g = G("x", "w", "b")
    wt = g.op(aten.permute.default, g.inputs[1], [1, 0])
    fc = g.op(aten.addmm.default, g.inputs[2], g.inputs[0], wt)
    v = g.op(aten.view.default, fc, [2, 4, 8])
    act = g.op(aten.gelu.default, v)
    groups = find_groups(CORE, g.done(act))
    (group,) = named(groups, "addmm_gelu")
    assert group.nodes == (wt.name, fc.name, v.name, act.name)
    # the un-transposed form (matmul_gelu) also covers addmm -> view -> gelu: the planner prices both
    (other,) = named(groups, "addmm_gelu_untransposed")
    assert other.nodes == (fc.name, v.name, act.name)
    # and core 1.22.0's addmm reading the transposed weight in place (trans_b) covers permute -> addmm
    (inplace,) = named(groups, "addmm_permuted_b")
    assert inplace.nodes == (wt.name, fc.name) and len(groups) == 3


class Counting(FxGraphView):
    def __init__(self, graph):
        super().__init__(graph)
        self.reads = 0

    def readers(self, value):
        self.reads += 1
        return super().readers(value)


def test_fusions_are_tried_only_at_their_root_ops():
    g = G("x")
    h = g.inputs[0]
    for _ in range(20):
        h = g.op(aten.tanh.default, h)      # no core fusion starts at tanh (core 1.9.0 starts silu_mul at sigmoid)
    view = Counting(g.graph)
    g.graph.output(h)
    assert FusionIndex(CORE).find(view) == [] and view.reads == 0
    assert "aten.conv2d.default" in FusionIndex(CORE).root_ops


def test_a_pattern_with_two_ends_is_refused_when_compiled():
    bad = textwrap.dedent("""\
        pack: {name: bad, version: 1.0.0}
        rules:
          - {op: aten.relu.default, kernel: relu, args: {self: tensor}, bind: {a: self}}
          - {op: aten.neg.default, kernel: neg, args: {self: tensor}, bind: {a: self}}
        fusions:
          - name: two_ends
            kernel: relu
            pattern:
              - {id: a, op: aten.relu.default}
              - {id: b, op: aten.neg.default}
              - {id: c, op: aten.relu.default, from: a}
            bind: {a: a.self}
        """)
    report = check_pack_text(bad, "bad.yaml")
    assert not report.ok
    assert any("the pattern ends in 2 steps (b, c)" in str(d) for d in report.diagnostics)


def gelu_new(g, x, half_scalar=0.5, swap_sum=False, y=None):
    """GPT-2's gelu_new as torch.export captures it (transformers' NewGELUActivation);
    ``y``: a different value in the inner sum (not GELU)."""
    half = g.op(aten.mul.Tensor, x, half_scalar)
    cube = g.op(aten.pow.Tensor_Scalar, x, 3.0)
    c1 = g.op(aten.mul.Tensor, cube, 0.044715)
    inner = g.op(aten.add.Tensor, *((c1, x if y is None else y) if swap_sum else (x if y is None else y, c1)))
    th = g.op(aten.tanh.default, g.op(aten.mul.Tensor, inner, 0.7978845608028654))
    return g.op(aten.mul.Tensor, half, g.op(aten.add.Tensor, th, 1.0)), (half, cube, inner)


@pytest.mark.parametrize("swap_sum", [False, True])
def test_gelu_tanh_written_out_is_one_group_over_its_shared_input(swap_sum):
    g = G("x")
    out, (half, cube, inner) = gelu_new(g, g.inputs[0], swap_sum=swap_sum)
    (group,) = find_groups(CORE, g.done(out))
    assert group.fusion.name == "gelu_tanh_decomposed" and group.fusion.kernel == "gelu"
    assert len(group.nodes) == 8 and group.output == out.name and group.node("half") == half.name
    assert group.node("cube") == cube.name and group.node("inner") == inner.name


def test_gelu_tanh_needs_one_value_in_its_three_reads():
    g = G("x", "y")
    out, _ = gelu_new(g, g.inputs[0], y=g.inputs[1])       # x + 0.044715 y^3: not GELU
    assert find_groups(CORE, g.done(out)) == []
    g = G("x")
    out, (half, _, _) = gelu_new(g, g.inputs[0])
    assert find_groups(CORE, g.done(out, half)) == []      # an intermediate escapes


def test_same_groups_are_checked_when_compiled():
    bad = textwrap.dedent("""\
        pack: {name: bad, version: 1.0.0}
        rules:
          - {op: aten.relu.default, kernel: relu, args: {self: tensor}, bind: {a: self}}
          - {op: aten.neg.default, kernel: neg, args: {self: tensor}, bind: {a: self}}
        fusions:
          - name: shared
            kernel: relu
            pattern:
              - {id: a, op: aten.relu.default}
              - {id: b, op: aten.neg.default}
            same: [[a.self, b.other], [a.self, c.self]]
            bind: {a: a.self}
        """)
    report = check_pack_text(bad, "bad.yaml")
    text = "\n".join(str(d) for d in report.diagnostics)
    assert not report.ok
    assert "'other' is not an argument of aten.neg.default" in text and "'c' is not a step" in text
