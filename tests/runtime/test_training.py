"""Training through the backend: AOTAutograd forward and backward graphs both planned and
executed on NPU-V3 with precision float16; gradients vs eager; an optimizer step."""
import copy

import pytest
import torch
from torch import nn

from tests.runtime.models import rel_err
from torchfl.runtime.backend import recording

V3 = {"chip": "NPU-V3", "precision": "float16"}
# gradients pass through fp16 storage in both graphs (fp32 accumulation): relative to the
# largest eager gradient entry of each parameter
GRAD_TOL = 5e-2


class ConvNet(nn.Module):
    """conv -> batch-norm -> relu -> linear. The conv has no bias, as before any batch-norm:
    its gradient would be identically zero (the batch-norm removes every per-channel
    constant), so a relative error against eager's would measure rounding noise only."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


class Block(nn.Module):
    """layer_norm -> linear -> gelu -> linear, residual: the transformer MLP."""

    def __init__(self, d=32):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


def _grads_vs_eager(factory, x, target):
    torch.manual_seed(0)
    eager = factory().train()
    ours = copy.deepcopy(eager)
    loss_fn = nn.CrossEntropyLoss() if target is not None else None
    compiled = torch.compile(ours, backend="torchfl", options=V3)
    with recording(analyze=True) as rec:
        out = compiled(x)
        loss = loss_fn(out, target) if loss_fn else out.pow(2).mean()
        loss.backward()
    ref_out = eager(x)
    ref_loss = loss_fn(ref_out, target) if loss_fn else ref_out.pow(2).mean()
    ref_loss.backward()
    assert rel_err(out, ref_out) < GRAD_TOL
    for (name, p), q in zip(ours.named_parameters(), eager.parameters()):
        assert p.grad is not None, name
        assert rel_err(p.grad, q.grad) < GRAD_TOL, (name, rel_err(p.grad, q.grad))
    kinds = [cg.kind for cg, _p, _r in rec.entries]
    assert kinds == ["forward", "backward"], kinds
    return ours, eager, compiled, rec


def _relu_margin(factory, x) -> float:
    """How far eager's pre-activations (after the batch-norm) stay from the ReLU threshold."""
    torch.manual_seed(0)       # the initialisation _grads_vs_eager uses
    m = factory().train()
    with torch.no_grad():
        return float(m.bn(m.conv(x)).abs().min())


def test_convnet_training_step_gradients_and_sgd():
    torch.manual_seed(0)       # the data do not depend on which tests ran before
    x = torch.randn(4, 3, 8, 8)
    target = torch.tensor([1, 3, 5, 7])
    # The float16 policy rounds parameters and activations: a pre-activation within ~1e-4 of
    # zero may change side (an ideal fp16 computation flips it too), and one ReLU mask bit in
    # this batch of 256 values per channel moves the conv and bn gradients by several percent.
    # The data keep a margin, so that the comparison measures the chip, not that tie.
    assert _relu_margin(ConvNet, x) > 2e-4
    ours, eager, compiled, rec = _grads_vs_eager(ConvNet, x, target)
    bw_routes = rec.entries[1][2].routes
    kernels = {k for per_op in bw_routes.values() for k in per_op}
    assert "batch_norm_backward" in kernels
    assert "conv2d_backward_weight" in kernels        # x needs no gradient: weight (and bias) only
    assert "CPU fallback" not in kernels, bw_routes
    # one SGD step on both; the parameters stay within tolerance of eager's
    for model in (ours, eager):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.step()
    for p, q in zip(ours.parameters(), eager.parameters()):
        assert rel_err(p, q) < GRAD_TOL
    # and the next forward uses the updated weights (cached weight casts invalidated)
    with torch.no_grad():
        assert rel_err(compiled(x), eager(x)) < GRAD_TOL


def test_layer_norm_mlp_backward_on_chip():
    torch.manual_seed(0)
    x = torch.randn(2, 8, 32, requires_grad=False)
    _ours, _eager, _c, rec = _grads_vs_eager(Block, x, None)
    bw_routes = rec.entries[1][2].routes
    kernels = {k for per_op in bw_routes.values() for k in per_op}
    assert "layer_norm_backward" in kernels, bw_routes
    assert "CPU fallback" not in kernels, bw_routes


def test_training_on_an_unknown_chip_or_registry_is_one_error_at_the_call(tmp_path):
    """The training path resolves the chip before AOTAutograd: an unknown chip or an unreadable
    registry is torchfl's own one-line error, raised when the compiled model is called."""
    from torchfl.planner.errors import PlanError
    from torchfl.registry import RegistryError

    cases = [({"chip": "NO-SUCH-CHIP"}, PlanError, "NO-SUCH-CHIP"),
             ({"chip": "NPU-V3", "registry": f"sqlite:///{tmp_path}"}, RegistryError, "registry")]
    for options, kind, word in cases:
        torch._dynamo.reset()
        model = torch.compile(nn.Linear(4, 2), backend="torchfl", options=options)
        with pytest.raises(kind, match=word) as err:
            model(torch.randn(3, 4))
        assert len(str(err.value).splitlines()) == 1, str(err.value)


class SelfAttention(nn.Module):
    """q, k, v from one linear, then ``scaled_dot_product_attention`` (every transformer's core)."""

    def __init__(self, causal: bool):
        super().__init__()
        self.qkv = nn.Linear(64, 192)
        self.causal = causal

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 16, 3, 4, 16).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_gradients_match_eager(causal):
    """Was: q/k/v gradients off by 10-100x the gradient itself, silently (every compiled
    transformer's training). AOTAutograd traced attention as the CPU flash kernel, whose core
    decomposition returns the probabilities where the backward expects the log-sum-exp; the
    backward (a CPU fallback) then computed from the wrong saved tensor. Training now
    differentiates attention's math (matmuls and softmax), every part on the chip."""
    torch.manual_seed(0)
    m = SelfAttention(causal)
    ref = copy.deepcopy(m)
    x, r = torch.randn(2, 16, 64), torch.randn(2, 4, 16, 16)
    with recording() as rec:
        out = torch.compile(m, backend="torchfl", options={"chip": "TFL-X1", "strict": True})(x)
        (out * r).sum().backward()
    want = ref(x)
    (want * r).sum().backward()
    assert rel_err(out, want) < 1e-5
    # float32 on TFL-X1: the same products summed in another order (~1e-7 relative), through a
    # softmax backward; 1e-4 leaves room for that and none for a wrong saved tensor (~10)
    assert rel_err(m.qkv.weight.grad, ref.qkv.weight.grad) < 1e-4
    assert rel_err(m.qkv.bias.grad, ref.qkv.bias.grad) < 1e-4
    assert all(not plan.fallbacks for _cg, plan, _r in rec.entries)
