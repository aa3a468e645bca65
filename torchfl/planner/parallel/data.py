"""Data parallel training: every chip holds the whole model, runs its share of the batch, and the
gradients are summed over the chips by one ring all-reduce before the optimizer step.

One bucket of every trainable parameter's gradient (PyTorch DDP fills several buckets of 25 MiB and
overlaps them with the backward; the bytes are the same, the overlap is not modelled: the
all-reduce is priced after the backward). The schedule (:func:`gradient_bytes`) is what both the
price (:func:`gradient_all_reduce_s`) and the emulated step's byte check
(``runtime/parallel/data.py``) read.
"""

from __future__ import annotations


def gradient_bytes(model, dp: int) -> dict:
    """The gradient all-reduce of one data-parallel step of ``model`` over ``dp`` chips: bytes of
    every trainable parameter's gradient (in its dtype) and ``link_bytes`` over all links (every
    chip sends ``all_reduce_sent``)."""
    from torchfl.planner.parallel.collectives import all_reduce_sent

    nbytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return {"all_reduces": 1 if dp > 1 else 0, "all_reduce_bytes": nbytes,
            "link_bytes": {"all_reduce": dp * all_reduce_sent(nbytes, dp)}}


def gradient_all_reduce_s(model, dp: int, ic) -> float:
    """Seconds of the gradient all-reduce of one step (not overlapped with the backward)."""
    from torchfl.planner.parallel.collectives import all_reduce_s

    return all_reduce_s(gradient_bytes(model, dp)["all_reduce_bytes"], dp, ic)
