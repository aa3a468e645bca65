"""Clone elision (planner/elide.py): in a graph compiled whole, a clone nobody can tell from its
input is removed (its readers read the input: no step); one that leaves the graph, is written, or whose input
is written, stays a copy. Real torch graphs and the bundled TFL-X1; numerics against eager
PyTorch (float32 on TFL-X1's float32 unit: 1e-5 of the largest magnitude, as the other
compiled-path tests)."""
import pytest
import torch
from torch import nn

from torchfl.planner import plan_module
from torchfl.planner.capture import Captured
from torchfl.planner.elide import elide_clones


def _clone_steps(plan):
    """(node, kernel, tiling strategy) of every step covering a node named clone*."""
    return [(n, s.kernel, (s.tile or {}).get("strategy")) for s in plan.steps for n in s.nodes
            if n.startswith("clone")]


class DropoutMLP(nn.Module):
    """Eval-mode dropout: what BERT's layers leave in the ATen graph as aten.clone."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.drop = nn.Linear(32, 32), nn.Linear(32, 32), nn.Dropout(0.1)

    def forward(self, x):
        return self.b(self.drop(self.a(x))) + x


def test_eval_dropout_clone_is_no_step_in_a_compiled_plan():
    m = DropoutMLP().eval()
    x = torch.randn(4, 32)
    plan = plan_module(m, (x,), chip="TFL-X1")
    assert _clone_steps(plan) == []
    assert [s.kernel for s in plan.steps if s.kind in ("kernel", "fused")].count("copy") == 0
    assert any(n.startswith("clones elided (1)") for n in plan.notes), plan.notes
    assert "clones elided" in plan.explain("text")


def test_compiled_model_with_elided_clone_matches_torch():
    torch.manual_seed(0)
    m = DropoutMLP().eval()
    x = torch.randn(4, 32)
    with torch.no_grad():
        want = m(x)
        got = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1"})(x)
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_compiled_clone_then_write_to_the_input_keeps_the_old_values():
    """A user's ``y = x.clone(); x.add_(1)`` compiled: y must not see the write."""
    def f(x):
        y = x.clone()
        x.add_(1)
        return y * 2

    x = torch.randn(8)
    want = x.clone() * 2
    got = torch.compile(f, backend="torchfl", options={"chip": "TFL-X1"})(x)
    assert torch.equal(got, want)


def test_clone_that_is_an_output_stays_a_copy():
    class M(nn.Module):
        def forward(self, x):
            y = x.relu()
            return y.clone(), y + 1

    plan = plan_module(M(), (torch.randn(4, 8),), chip="TFL-X1")
    assert [(k, st) for _n, k, st in _clone_steps(plan)] == [("copy", "resident")]
    assert not any("clones elided" in n for n in plan.notes)
    assert any("its result leaves the graph" in n for n in plan.notes), plan.notes


def _captured_of(fn, *args):
    """An un-functionalised ATen graph (make_fx keeps in-place ops) as a Captured."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn)(*args)
    ph = [(n.name, "input", None) for n in gm.graph.nodes if n.op == "placeholder"]
    return Captured(gm, ph, {}, [])


def _targets(captured):
    return [str(n.target) for n in captured.graph_module.graph.nodes if n.op == "call_function"]


def test_clone_whose_input_is_written_stays_a_copy():
    def f(x):
        y = x.clone()
        x.add_(1)
        return y * 2

    cap = elide_clones(_captured_of(f, torch.randn(3)))
    assert "aten.clone.default" in _targets(cap)
    assert "writes to it or its input" in cap.extra["notes"][-1]


def test_clone_written_through_a_view_of_its_input_stays_a_copy():
    def f(x):
        v = x.view(-1)
        y = x.clone()
        v.mul_(3)
        return y + 1

    cap = elide_clones(_captured_of(f, torch.randn(2, 3)))
    assert "aten.clone.default" in _targets(cap)


def test_clone_that_is_written_itself_stays_a_copy():
    def f(x):
        y = x.clone()
        y.add_(1)
        return x + y

    cap = elide_clones(_captured_of(f, torch.randn(3)))
    assert "aten.clone.default" in _targets(cap)


def test_unwritten_clone_becomes_alias_and_the_graph_still_computes_the_same():
    def f(x):
        y = x.clone()
        return y * 2 + x

    x = torch.randn(3)
    cap = elide_clones(_captured_of(f, x))
    assert "aten.clone.default" not in _targets(cap)
    assert torch.equal(cap.graph_module(x), f(x))


def test_clone_to_another_memory_format_stays_a_copy():
    def f(x):
        y = x.clone(memory_format=torch.channels_last)
        return y + 1

    cap = elide_clones(_captured_of(f, torch.randn(1, 3, 4, 4)))
    assert "aten.clone.default" in _targets(cap)
    assert "memory_format" in cap.extra["notes"][-1]


def test_contiguous_clone_of_a_contiguous_input_is_an_alias():
    def f(x):
        return x.clone(memory_format=torch.contiguous_format) * 2

    cap = elide_clones(_captured_of(f, torch.randn(2, 3)))
    assert "aten.clone.default" not in _targets(cap)


@pytest.mark.parametrize("entry", ["plan_captured", "plan_module"])
def test_only_the_compiled_entries_elide(entry, packs, chips):
    """plan_captured (the eager device's one-op and lazy plans) never elides."""
    from torchfl.planner import Target, plan_captured
    from torchfl.planner.capture import capture_module

    m = DropoutMLP().eval()
    x = torch.randn(4, 32)
    if entry == "plan_module":
        plan = plan_module(m, (x,), chip="TFL-X1")
    else:
        plan = plan_captured(capture_module(m, (x,)), (x,), Target.of(chips["TFL-X1"], packs))
    kinds = {k for _n, k, _st in _clone_steps(plan)}
    assert kinds == (set() if entry == "plan_module" else {"copy"})
