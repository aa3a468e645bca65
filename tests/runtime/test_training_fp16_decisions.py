"""Why a depthwise-separable block's fp16 gradients differed from eager fp32 by ~10% (issue 33).

Not a kernel error: with a mean loss every element the ReLU passes carries the same gradient
(1/numel), so the gradient of an input pixel is a sum of whole weights over the ReLU
decisions it feeds. The chip computes the forward in fp16 (the precision policy), and a
pre-activation within fp16 rounding of zero (a few 1e-4 here) can land on the other side of
the ReLU than in fp32: one flipped decision out of ~10^4 moves a gradient entry by one
weight x 1/numel, ~10% of the largest entry. Given the chip's own ReLU decisions, eager fp32
and the chip agree to fp16 precision; that is what this test checks, and that the flips
are the only difference."""
import copy

import torch
from torch import nn

from tests.runtime.models import rel_err

V3 = {"chip": "NPU-V3", "precision": "float16"}


class Masked(torch.autograd.Function):
    """relu with a given decision mask (the chip's), for the eager reference."""

    @staticmethod
    def forward(ctx, x, mask):
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, g):
        (mask,) = ctx.saved_tensors
        return g * mask, None


class DWSeparable(nn.Module):
    """depthwise 3x3 (stride 2) -> BN -> ReLU -> pointwise 1x1 -> BN -> ReLU (MobileNet's block);
    returns both activations so the chip's ReLU decisions can be read."""

    def __init__(self, c=32, k=64, masks=None):
        super().__init__()
        self.dw = nn.Conv2d(c, c, 3, 2, 1, groups=c, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.pw = nn.Conv2d(c, k, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(k)
        self.masks = masks

    def act(self, x, i):
        return torch.relu(x) if self.masks is None else Masked.apply(x, self.masks[i])

    def forward(self, x):
        h = self.act(self.bn1(self.dw(x)), 0)
        return h, self.act(self.bn2(self.pw(h)), 1)


def test_depthwise_separable_fp16_gradients_differ_only_by_relu_decisions():
    torch.manual_seed(0)
    eager = DWSeparable().train()
    ours = copy.deepcopy(eager)
    x = torch.randn(4, 32, 16, 16)
    xo, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    h, out = torch.compile(ours, backend="torchfl", options=V3)(xo)
    out.mean().backward()
    _, ref = eager(xr)
    ref.mean().backward()
    flips = int(((out > 0) != (ref > 0)).sum())
    assert 0 < flips < out.numel() // 1000      # a handful of decisions out of 16384
    assert rel_err(xo.grad, xr.grad) > 5e-2       # the reported ~10%: what the flips cost
    # eager fp32 with the chip's decisions: the gradients agree to fp16 precision
    masked = DWSeparable(masks=((h > 0).float().detach(), (out > 0).float().detach())).train()
    masked.load_state_dict(copy.deepcopy(eager.state_dict()))
    xm = x.clone().requires_grad_()
    masked(xm)[1].mean().backward()
    assert rel_err(xo.grad, xm.grad) < 5e-3, rel_err(xo.grad, xm.grad)
    for (name, p), q in zip(ours.named_parameters(), masked.parameters()):
        assert rel_err(p.grad, q.grad) < 5e-3, (name, rel_err(p.grad, q.grad))
