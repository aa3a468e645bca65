"""capture_training: forward and backward graphs of a real module through AOTAutograd,
whatever structure its outputs have (a Hugging Face model returns a dict-like ModelOutput;
taking it for a single non-tensor output once crashed with "'int' object has no attribute
'backward'"), and a clear refusal when no output carries a gradient."""
import pytest
import torch

from torchfl.planner.capture import CaptureError
from torchfl.planner.capture_training import capture_training


class DictOut(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return {"logits": self.fc(x).relu(), "mask": x > 0}


def _ops(captured) -> set:
    return {str(n.target) for n in captured.graph_module.graph.nodes if n.op == "call_function"}


def test_dict_outputs_give_forward_and_backward_graphs():
    forward, backward = capture_training(DictOut().train(), (torch.randn(3, 8),))
    assert "aten.addmm.default" in _ops(forward) or "aten.mm.default" in _ops(forward)
    assert any("threshold_backward" in op or "le" in op for op in _ops(backward)), _ops(backward)


def test_outputs_without_gradient_are_refused_by_name():
    frozen = torch.nn.Linear(8, 4).requires_grad_(False)
    with pytest.raises(CaptureError, match="carry no gradient"):
        capture_training(frozen, (torch.randn(3, 8),))


def test_a_dead_getitem_of_a_backward_graph_is_not_planned():
    """After any earlier ``torch.compile`` in the process, AOTAutograd leaves the unread input-gradient
    ``getitem`` of a first conv's ``convolution_backward`` (its mask [False, True, True]) in the backward
    graph. The planner folds a multi-output node's getitems into it and expects each to be read: strict
    mode refused the step ("getitem_3: no rule for <built-in function getitem>"), non-strict logged a
    host fallback. Unread getitems are dropped before planning."""
    frozen = torch.nn.Linear(8, 4).requires_grad_(False)
    torch.compile(frozen, backend="eager", fullgraph=True)(torch.randn(3, 8))
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).train()
    ref = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).train()
    ref.load_state_dict(block.state_dict())
    x = torch.randn(2, 3, 16, 16)
    compiled = torch.compile(block, backend="torchfl", options={"chip": "TFL-X1", "strict": True})
    compiled(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    for p, r in zip(block.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-5)
