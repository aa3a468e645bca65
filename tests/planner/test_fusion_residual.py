"""A ResNet block's tail, ``relu(x + bn(conv(x)))``, fuses into one conv2d_bn_add_relu with
the residual bound to ``x`` whichever side of the add it is on, and runs like eager.

The residual on the left used to bind ``add.other`` to the batch-norm output (the
commutative swap was decided by the walk and not applied by the binding): the plan then
read a value no step writes (KeyError 'getitem')."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.kernels.tolerances import TOL
from torchfl.planner.api import plan_captured
from torchfl.planner.capture import capture_module
from torchfl.planner.target import Target
from torchfl.runtime.executor import Executor


class Tail(nn.Module):
    def __init__(self, residual_first: bool):
        super().__init__()
        self.conv = nn.Conv2d(8, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.residual_first = residual_first

    def forward(self, x):
        y = self.bn(self.conv(x))
        return torch.relu(x + y) if self.residual_first else torch.relu(y + x)


def _model(residual_first):
    torch.manual_seed(0)
    m = Tail(residual_first).eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.2, 0.2)
    return m


def _eager_fp16_inputs(model, x):
    """Eager float32 on the values the plan stores (fp16 parameters and input)."""
    ref = copy.deepcopy(model)
    with torch.no_grad():
        for t in list(ref.parameters()) + list(ref.buffers()):
            if t.is_floating_point():
                t.copy_(t.half().float())
        return ref(x.half().float())


@pytest.mark.parametrize("residual_first", [True, False], ids=["relu(x+bn(conv(x)))", "relu(bn(conv(x))+x)"])
def test_residual_add_fuses_on_either_side_and_matches_eager(residual_first, chips, packs):
    model = _model(residual_first)
    x = torch.randn(2, 8, 10, 10)
    cap = capture_module(model, (x,))
    plan = plan_captured(cap, (x,), Target.of(chips["NPU-V3"], packs), precision="float16")
    fused = [s for s in plan.steps if s.kind == "fused"]
    assert [s.kernel for s in fused] == ["conv2d_bn_add_relu"]
    (step,) = fused
    assert step.ops[-2:] == ("aten.add.Tensor", "aten.relu.default")
    assert not plan.fallbacks and not [s for s in plan.steps if s.kind == "kernel"]
    # x feeds the conv and is the residual: the same (cast) graph input, twice
    x_value = step.inputs[0]
    assert x_value.split(".")[0] == "x" and step.inputs[-1] == x_value
    (y,) = Executor(plan).run((x,))
    rtol, atol = TOL["float16"]
    torch.testing.assert_close(y, _eager_fp16_inputs(model, x), rtol=rtol, atol=4 * atol)
