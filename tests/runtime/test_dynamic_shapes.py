"""New input shapes in training: Dynamo recompiles once, then hands AOTAutograd a
shape-polymorphic graph; every concrete shape gets its own plan (forward and backward),
run on the chip, with gradients as eager's."""
import copy

import torch
from torch import nn

from tests.runtime.models import rel_err

from torchfl.runtime.backend import recording

V3 = {"chip": "NPU-V3", "precision": "float16"}
GRAD_TOL = 5e-2   # as tests/runtime/test_training.py: fp16 storage in both graphs, fp32 accumulation


class MLP(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


def test_training_on_three_batch_sizes_replans_each():
    torch.manual_seed(0)
    ours = MLP()
    eager = copy.deepcopy(ours)
    compiled = torch.compile(ours, backend="torchfl", options=V3)
    planned = []
    for batch in (2, 3, 5):
        x = torch.randn(batch, 8, 32)
        ours.zero_grad()
        eager.zero_grad()
        with recording() as rec:
            compiled(x).pow(2).mean().backward()
        eager(x).pow(2).mean().backward()
        for p, q in zip(ours.parameters(), eager.parameters()):
            assert rel_err(p.grad, q.grad) < GRAD_TOL, (batch, rel_err(p.grad, q.grad))
        kinds = [cg.kind for cg, _p, _r in rec.entries]
        assert kinds == ["forward", "backward"], kinds
        fw_plan = rec.entries[0][1]
        planned.append(max(i.shape[0] for i in fw_plan.inputs if len(i.shape) == 3))
        assert not any(f.op for pl in (rec.entries[0][1], rec.entries[1][1]) for f in pl.fallbacks)
    assert planned == [2, 3, 5]


def test_a_module_without_parameters_recompiled_for_new_sizes():
    """A module with no parameters called at a second size: Dynamo recompiles it with symbolic
    sizes and hands the backend its lazily compiled GraphModule, whose forward is
    ``(*args, **kwargs)``; torch.export read that as one input and the symbolic capture failed
    ("`inputs` has 1 elements, but `dynamic_shapes` has 5"), so the second call raised instead
    of running. Every size now runs on the chip, equal to eager."""

    class Scores(nn.Module):
        def forward(self, a, b, c):
            return torch.bmm(a, b.transpose(1, 2)) + c

    torch.manual_seed(0)
    model = Scores()
    compiled = torch.compile(model, backend="torchfl", options={"chip": "TFL-X1"})
    for n in (4, 6, 8):
        a, b, c = torch.randn(2, n, 8), torch.randn(2, n, 8), torch.randn(2, n, n)
        torch.testing.assert_close(compiled(a, b, c), model(a, b, c), rtol=1e-5, atol=1e-5)
