"""Batch-norm training in a reduced-precision graph (a bfloat16 / float16 model, no precision
policy) runs on the chip, forward and backward.

Found by the real-chips work: on every chip, `_native_batch_norm_legit_functional` of a
bfloat16 model fell back to the CPU ("batch_norm_train would produce bfloat16 as output 3 ...,
the plan needs float32 here"): ATen's decomposition, which the graph's metadata follows,
computes the new running statistics from the float32 batch statistics (float32 outputs), and
returns the saved statistics in the input's dtype, which the backward kernel refused. Then the
running-mean read by the graph's copy into the module's buffer (a side output of rank 1 of a
rank-4 node) crashed the selection with a rank-4 layout conversion to 'A'.

Tolerance: bfloat16 keeps 8 significant bits (relative step 2^-8 = 0.4%); the chip and
eager torch both accumulate statistics and gradient sums in float32, but round inputs,
intermediates and outputs to bfloat16 at different points, so elementwise differences of a
few bfloat16 steps of the largest magnitude are expected: 3% of max |eager| (float16: 1%,
its 11 bits).
"""
from __future__ import annotations

import pytest
import torch

TOL = {torch.bfloat16: 3e-2, torch.float16: 1e-2}


def _block(dtype):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU()).to(dtype).train()


def _close(ours, ref, tol, what):
    scale = max(1.0, ref.float().abs().max().item())
    err = (ours.float() - ref.float()).abs().max().item() / scale
    assert err <= tol, f"{what}: max error {err:.3g} of scale {scale:.3g} (tolerance {tol})"


@pytest.mark.parametrize("chip,dtype", [("TFL-X1", torch.bfloat16), ("TFL-X1", torch.float16)])
def test_batch_norm_training_in_the_graphs_dtype_runs_on_the_chip(chip, dtype):
    eager, ours = _block(dtype), _block(dtype)
    x = torch.randn(2, 3, 16, 16, dtype=dtype)
    compiled = torch.compile(ours, backend="torchfl", options={"chip": chip, "strict": True})
    y_ref = eager(x)
    y_ref.float().pow(2).mean().backward()
    y = compiled(x)                       # strict: a fallback anywhere raises
    y.float().pow(2).mean().backward()
    tol = TOL[dtype]
    _close(y, y_ref, tol, "output")
    for (name, p_ref), p in zip(eager.named_parameters(), ours.parameters()):
        _close(p.grad, p_ref.grad, tol, f"grad of {name}")
    bn_ref, bn = eager[1], ours[1]
    assert bn.running_mean.dtype == dtype
    _close(bn.running_mean, bn_ref.running_mean, tol, "running_mean")
    _close(bn.running_var, bn_ref.running_var, tol, "running_var")
