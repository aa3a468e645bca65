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
