"""Expert parallel for a mixture-of-experts decoder (Mixtral): experts split over the chips, tokens too.

``ep`` chips each hold E / ep experts of every MoE layer and the rest of the model whole, and run
batch / ep sequences. Per MoE layer two all-to-alls: the dispatch (every chip sends each other chip
the hidden states of its tokens routed to that chip's experts) and the combine (the experts'
outputs sent back). Buffers have a fixed capacity (GShard's): one slot per token of the sending
chip for every expert (capacity factor E / top_k: no token is ever dropped), so the bytes do not
depend on the routing and a plan knows them exactly: each all-to-all block is E / ep x
(batch / ep x tokens) x hidden elements. The schedule (:func:`expert_bytes`) is what both the price
(:func:`expert_seconds`) and the emulated run's byte check (``runtime/parallel/experts.py``) read.
"""

from __future__ import annotations

from torchfl.planner.parallel.split import ParallelError


def check_experts(cfg, ep: int) -> int:
    """The experts per MoE layer of ``cfg``, refused (one line) unless ``ep`` divides them."""
    experts = getattr(cfg, "num_local_experts", None)
    if not isinstance(experts, int):
        raise ParallelError(f"expert parallel needs config.num_local_experts; {type(cfg).__name__} has none: "
                            "only mixture-of-experts decoders (Mixtral) are split by experts")
    if experts % ep:
        raise ParallelError(f"expert parallel {ep} does not divide the {experts} experts; use an --ep that "
                            f"divides {experts}")
    return experts


def check_batch(ep: int, batch: int) -> None:
    """Refused (one line) unless ``ep`` divides the batch: each ep group runs batch / ep sequences."""
    if batch % ep:
        raise ParallelError(f"expert parallel {ep} does not divide the batch of {batch}; use a batch that is a "
                            f"multiple of {ep} (--batch)")


def expert_bytes(cfg, ep: int, batch: int, tokens: int, item: int) -> dict:
    """The all-to-alls of one forward (two per MoE layer) and the bytes they move over all links."""
    from torchfl.planner.parallel.collectives import all_to_all_sent

    check_experts(cfg, ep)
    check_batch(ep, batch)
    block = cfg.num_local_experts // ep * (batch // ep) * tokens * cfg.hidden_size * item
    calls = 2 * cfg.num_hidden_layers if ep > 1 else 0
    return {"all_to_alls": calls, "block_bytes": block,
            "link_bytes": {"all_to_all": calls * ep * all_to_all_sent(block, ep)}}


def expert_seconds(cfg, ep: int, batch: int, tokens: int, item: int, ic) -> float:
    """Seconds of one forward's all-to-alls (not overlapped with the experts' compute)."""
    from torchfl.planner.parallel.collectives import all_to_all_s

    b = expert_bytes(cfg, ep, batch, tokens, item)
    return b["all_to_alls"] * all_to_all_s(b["block_bytes"], ep, ic)
