"""One data-parallel training step on emulated chips: the gradient all-reduce moved and counted.

Every chip holds a replica of the model, compiled for training with the torchfl backend (the
forward and the backward are plans on the chip), and runs ``batch / dp`` sequences. Its loss is
the token cross-entropy *summed* over its sequences and divided by the token count of the whole
batch, so the chips' gradients add up to the full batch's mean-loss gradient: one ring all-reduce
(sum) of one bucket holding every gradient (``planner.parallel.data``: the schedule the check
reads) gives every chip the one-chip, full-batch gradients.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from torchfl.runtime.parallel.links import Counted, Links
from torchfl.runtime.parallel.programs import many_shapes, on_chip


class _TokenLoss(nn.Module):
    """Next-token cross-entropy of ``lm`` summed over the tokens given, over ``total`` tokens."""

    def __init__(self, lm, total: int):
        super().__init__()
        self.lm, self.total = lm, float(total)

    def forward(self, ids):
        logits = self.lm(ids).logits
        vocab = logits.shape[-1]
        loss = F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1), reduction="sum")
        return loss / self.total


def full_batch_loss(model, input_ids) -> torch.Tensor:
    """The loss the split step reproduces (mean next-token cross-entropy of the whole batch), on the host."""
    return _TokenLoss(model, input_ids.shape[0] * (input_ids.shape[1] - 1))(input_ids)


@dataclass
class DataParallelRun(Counted):
    """Loss (summed over chips), every chip's all-reduced gradients (name -> tensor), the links'
    bytes, the plan's, and the chip plans' host fallbacks."""

    chip: str
    dp: int
    loss: torch.Tensor
    grads: list                  # per chip: {name: gradient}
    links: dict
    planned: dict
    fallbacks: int


def data_parallel_step(model, input_ids, chips: str = "2xH100-SXM5-80GB", precision=None) -> DataParallelRun:
    """``model``'s gradients of one training step on ``input_ids`` split over ``chips`` (data parallel)."""
    from torchfl.planner.parallel import ParallelError, parse_chips
    from torchfl.planner.parallel.data import gradient_bytes
    from torchfl.runtime.recording import recording

    want = parse_chips(chips)
    dp, (batch, tokens) = want.count, input_ids.shape
    if batch % dp:
        raise ParallelError(f"data parallel {dp} does not divide the batch of {batch}; use a batch that is a "
                            f"multiple of {dp}")
    replicas = [copy.deepcopy(model).train() for _ in range(dp)]
    per = batch // dp
    losses = []
    with recording() as rec, many_shapes():
        for i, replica in enumerate(replicas):
            replica.zero_grad(set_to_none=True)
            step = on_chip(_TokenLoss(replica, batch * (tokens - 1)), want.chip, precision)
            loss = step(input_ids[i * per:(i + 1) * per])
            loss.backward()
            losses.append(loss.detach())
    links = Links()
    names = [n for n, p in replicas[0].named_parameters() if p.requires_grad]
    buckets = [torch.cat([dict(r.named_parameters())[n].grad.reshape(-1) for n in names]) for r in replicas]
    summed = links.all_reduce(list(range(dp)), buckets)
    grads = [_unflatten(bucket, replicas[0], names) for bucket in summed]
    fallbacks = sum(plan.summary.fallbacks for _g, plan, _r in rec.entries)
    return DataParallelRun(want.chip, dp, sum(losses), grads, links.report(),
                           gradient_bytes(model, dp)["link_bytes"], fallbacks)


def _unflatten(bucket, model, names) -> dict:
    params, out, at = dict(model.named_parameters()), {}, 0
    for n in names:
        p = params[n]
        out[n] = bucket[at:at + p.numel()].reshape(p.shape)
        at += p.numel()
    return out
