"""One data-parallel training step of a tiny LLaMA on emulated chips: the full batch's gradients.

Tolerance: float32 gradients within 1e-6 of the one-chip full-batch gradients (measured 1.2e-7):
the split changes the order of the sums only (each chip's sum over its sequences, then the ring's).
"""

from __future__ import annotations

import pytest
import torch

from torchfl.planner.lm import tiny_llama
from torchfl.planner.parallel import ParallelError, all_reduce_s
from torchfl.planner.parallel.data import gradient_all_reduce_s, gradient_bytes
from torchfl.planner.whatif import chip_of
from torchfl.runtime.parallel import data_parallel_step, full_batch_loss


@pytest.fixture(scope="module")
def model():
    lm, (ids,) = tiny_llama(batch=4, seq_len=8)
    loss = full_batch_loss(lm, ids)
    loss.backward()
    return lm, ids, loss.detach(), {n: p.grad.clone() for n, p in lm.named_parameters()}


def test_a_data_parallel_step_gives_every_chip_the_full_batch_gradients(model):
    lm, ids, loss, ref = model
    run = data_parallel_step(lm, ids, chips="2xH100-SXM5-80GB")
    assert torch.allclose(run.loss, loss, rtol=0, atol=1e-6)
    for grads in run.grads:
        assert set(grads) == set(ref)
        assert max((grads[n] - ref[n]).abs().max().item() for n in ref) <= 1e-6
    assert all(torch.equal(run.grads[0][n], run.grads[1][n]) for n in ref)      # one sum, copied
    nbytes = sum(p.numel() * 4 for p in lm.parameters())
    assert run.counted == run.planned == {"all_reduce": 2 * nbytes} and run.matches_plan()
    assert run.links["links"] == {"0->1": nbytes, "1->0": nbytes}
    ic = chip_of("H100-SXM5-80GB").hcd.interconnect
    assert run.link_seconds(ic) == pytest.approx(gradient_all_reduce_s(lm, 2, ic), rel=1e-12)
    assert all(p.grad is not None for p in lm.parameters())                       # the model's own grads untouched
    assert torch.equal(next(lm.parameters()).grad, next(iter(ref.values())))


def test_the_gradient_all_reduce_is_priced_from_the_same_bytes(model):
    lm = model[0]
    ic = chip_of("H100-SXM5-80GB").hcd.interconnect
    nbytes = gradient_bytes(lm, 4)["all_reduce_bytes"]
    assert nbytes == sum(p.numel() * 4 for p in lm.parameters())
    assert gradient_all_reduce_s(lm, 4, ic) == all_reduce_s(nbytes, 4, ic) > 0
    assert gradient_bytes(lm, 1)["link_bytes"] == {"all_reduce": 0.0}


def test_a_batch_the_chips_do_not_divide_is_refused(model):
    lm, ids, _, _ = model
    with pytest.raises(ParallelError, match="data parallel 3 does not divide the batch of 4"):
        data_parallel_step(lm, ids, chips="3xH100-SXM5-80GB")
