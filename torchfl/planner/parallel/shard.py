"""One tensor-parallel shard of a decoder LM, as a model the single-chip planner plans unchanged.

Megatron-style tensor parallelism: q/k/v and gate/up projections are column-parallel (each chip
holds heads/tp query heads, kv_heads/tp key/value heads and intermediate/tp MLP columns), o_proj
and down_proj row-parallel (their outputs are partial sums, all-reduced: two all-reduces a
layer), the embedding and the LM head vocabulary-parallel (vocab/tp rows each: one more
all-reduce after the embedding, an all-gather of the logits). One shard is exactly the model
whose config has those sizes divided by tp and ``head_dim`` kept, so building it from the config
(on the meta device: no weights) gives every shard's shapes, FLOPs and bytes. Key/value heads
fewer than tp are replicated (one per chip), as vLLM and TensorRT-LLM do.
"""

from __future__ import annotations

import copy

from torchfl.planner.errors import PlanError


class ShardError(PlanError, ValueError):
    """A model that cannot be split ``tp`` ways (one line: what, which size, how to fix)."""


#: config fields split by tp (name -> what it is, for the refusal)
_SPLIT = {"num_attention_heads": "attention heads", "intermediate_size": "MLP width", "vocab_size": "vocabulary"}


def shard_config(config, tp: int):
    """A copy of a Hugging Face decoder ``config`` for one of ``tp`` shards (module docstring)."""
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


def shard_lm(lm, tp: int, layers: int | None = None):
    """One tensor-parallel shard of ``lm`` (``layers``: that many decoder layers, a pipeline
    stage), built on the meta device in ``lm``'s dtype; ``lm`` itself when nothing changes."""
    import torch

    if tp == 1 and (layers is None or layers == lm.config.num_hidden_layers):
        return lm
    cfg = shard_config(lm.config, tp)
    if layers is not None:
        cfg = copy.deepcopy(cfg) if cfg is lm.config else cfg
        cfg.num_hidden_layers = layers
        if getattr(cfg, "layer_types", None) is not None:
            cfg.layer_types = list(cfg.layer_types)[:layers]
    dtype = next(iter(lm.parameters())).dtype
    with torch.device("meta"):
        return type(lm)(cfg).to(dtype).eval()
