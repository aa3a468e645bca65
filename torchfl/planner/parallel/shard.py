"""One tensor-parallel shard of a decoder LM, as a model the single-chip planner plans unchanged.

Megatron-style tensor parallelism: q/k/v and gate/up projections are column-parallel (each chip
holds heads/tp query heads, kv_heads/tp key/value heads and intermediate/tp MLP columns), o_proj
and down_proj row-parallel (their outputs are partial sums, all-reduced: two all-reduces a
layer), the embedding and the LM head vocabulary-parallel (vocab/tp rows each: one more
all-reduce after the embedding, an all-gather of the logits). One shard is exactly the model
whose config has those sizes divided by tp and ``head_dim`` kept, so building it from the config
(on the meta device: no weights) gives every shard's shapes, FLOPs and bytes. Key/value heads
fewer than tp are replicated (one per chip), as vLLM and TensorRT-LLM do.

Expert parallel (``ep``, mixture-of-experts decoders): a chip holds E / ep experts of every MoE
layer, so its shard is the config with ``num_local_experts`` = E / ep (its router scores only
those: a stated simplification, the router is a [hidden, E] matmul) and ``num_experts_per_tok``
= min(k, E / ep): a chip's experts are at most all of its experts per token. The shard's batch is
batch / ep (``split.py``: attention runs data parallel over the ep groups).
"""

from __future__ import annotations

import copy

from torchfl.planner.errors import PlanError


class ShardError(PlanError, ValueError):
    """A model that cannot be split ``tp`` ways (one line: what, which size, how to fix)."""


#: config fields split by tp (name -> what it is, for the refusal)
_SPLIT = {"num_attention_heads": "attention heads", "intermediate_size": "MLP width", "vocab_size": "vocabulary"}


def expert_config(config, ep: int):
    """A copy of a mixture-of-experts ``config`` holding E / ``ep`` experts (module docstring); ``config``
    itself for ``ep`` 1 (refused by ``experts.check_experts``: no experts, ep not dividing them)."""
    if ep == 1:
        return config
    from torchfl.planner.parallel.experts import check_experts

    experts = check_experts(config, ep)
    cfg = copy.deepcopy(config)
    cfg.num_local_experts = experts // ep
    cfg.num_experts_per_tok = min(config.num_experts_per_tok, experts // ep)
    return cfg


def shard_config(config, tp: int, ep: int = 1):
    """A copy of a Hugging Face decoder ``config`` for one of ``tp`` x ``ep`` shards (module docstring)."""
    if ep > 1:
        config = expert_config(config, ep)
    if tp == 1:
        return config
    for name, what in _SPLIT.items():
        value = getattr(config, name, None)
        if not isinstance(value, int):
            raise ShardError(f"tensor parallel needs config.{name} ({what}); {type(config).__name__} has none: "
                             "only LLaMA-family decoders (LLaMA, Mistral, Qwen2) are split")
        if value % tp:
            raise ShardError(f"tensor parallel {tp} does not divide the {what} (config.{name} = {value}); "
                             f"use a --tp that divides {value}")
    cfg = copy.deepcopy(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    if kv >= tp and kv % tp:
        raise ShardError(f"tensor parallel {tp} does not divide the key/value heads ({kv}); use a --tp that "
                         f"divides {kv} or is a multiple of it")
    if kv < tp and tp % kv:
        raise ShardError(f"tensor parallel {tp} is not a multiple of the {kv} key/value heads: a chip's query heads "
                         f"would need two key/value heads; use a --tp that divides {kv} or is a multiple of it")
    cfg.head_dim = head_dim
    cfg.num_attention_heads = heads // tp
    cfg.num_key_value_heads = max(1, kv // tp)
    cfg.intermediate_size = config.intermediate_size // tp
    cfg.vocab_size = config.vocab_size // tp
    return cfg


def shard_lm(lm, tp: int, layers: int | None = None, ep: int = 1):
    """One tensor-parallel (and, ``ep`` > 1, expert-parallel) shard of ``lm`` (``layers``: that many
    decoder layers, a pipeline stage), built on the meta device in ``lm``'s dtype; ``lm`` itself
    when nothing changes."""
    import torch

    if tp == 1 and ep == 1 and (layers is None or layers == lm.config.num_hidden_layers):
        return lm
    cfg = shard_config(lm.config, tp, ep)
    if layers is not None:
        cfg = copy.deepcopy(cfg) if cfg is lm.config else cfg
        cfg.num_hidden_layers = layers
        if getattr(cfg, "layer_types", None) is not None:
            cfg.layer_types = list(cfg.layer_types)[:layers]
    dtype = next(iter(lm.parameters())).dtype
    with torch.device("meta"):
        return type(lm)(cfg).to(dtype).eval()
