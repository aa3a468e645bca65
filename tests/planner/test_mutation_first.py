"""A graph that writes to its inputs is refused before it is planned (issue 35).

``plan_dynamo`` found the writes by comparing the finished plan's outputs with the Dynamo
graph's: a whole plan made, then thrown away by the backend (which compiles the graph
through AOTAutograd instead). Now the capture is checked before any planning, so an error
that only planning finds (here: a strict plan's fallback) never hides the mutation.
"""
import pytest
import torch
from torch import nn

from torchfl.planner import plan_dynamo
from torchfl.planner.errors import MutatesInputs, StrictFallbackError
from torchfl.planner.target import Target


class WritesItsInput(nn.Module):
    def forward(self, x):
        x.add_(1.0)                        # a write to the caller's tensor
        return torch.flip(x, [1]) * 2      # flip has no chip kernel: a fallback, refused when strict


class ReadsOnly(nn.Module):
    def forward(self, x):
        return torch.flip(x + 1.0, [1]) * 2


def _dynamo_graph(module, x):
    """The GraphModule and args torch.compile hands a backend."""
    seen = []

    def grab(gm, args):
        seen.append((gm, list(args)))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(module, backend=grab)(x.clone())
    (gm, args), = seen
    return gm, args


def test_a_write_to_an_input_is_found_before_planning(chips, packs):
    gm, args = _dynamo_graph(WritesItsInput(), torch.randn(2, 8))
    target = Target.of(chips["TFL-X1"], packs)
    # strict planning would refuse the flip; the write is found first, before any plan is made
    with pytest.raises(MutatesInputs, match="writes to some of its inputs"):
        plan_dynamo(gm, args, target, strict=True)


def test_a_graph_that_only_reads_its_inputs_is_planned(chips, packs):
    gm, args = _dynamo_graph(ReadsOnly(), torch.randn(2, 8))
    target = Target.of(chips["TFL-X1"], packs)
    with pytest.raises(StrictFallbackError, match="flip"):
        plan_dynamo(gm, args, target, strict=True)
    plan, user = plan_dynamo(gm, args, target)
    assert len(plan.outputs) == 1 and user == (0,)
