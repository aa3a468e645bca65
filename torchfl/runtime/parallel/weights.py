"""One chip's shard of a decoder LM with real weights: the planner's shard shapes, the weights sliced.

The shapes are the planner's (``planner.parallel.shard.shard_lm``: the config with heads, key/value
heads, MLP width and vocabulary divided by tp, L / pp layers); this module only fills them with
rank ``r``'s slice of the unsplit model's weights (Megatron's layout):

* column-parallel (q/k/v, gate/up): output rows ``r x n .. (r + 1) x n`` (and their bias);
* row-parallel (o_proj, down_proj): input columns of the same block; a bias only on rank 0 (the
  all-reduce adds the partial sums, so a bias on every rank would count tp times);
* vocabulary-parallel embedding and LM head: vocabulary rows ``r x V / tp ..``;
* key/value heads fewer than tp: rank r holds key/value head ``r // (tp / kv)``, the one its query
  heads read (``shard_config`` refuses a tp that is not a multiple of kv);
* norms and the rotary tables: replicated.
"""

from __future__ import annotations

import torch


def _block(weight: torch.Tensor, dim: int, index: int, size: int) -> torch.Tensor:
    return weight.narrow(dim, index * size, size)


def _heads(config, tp: int, rank: int) -> tuple[int, int, int]:
    """(first query head, first key/value head, head_dim) of ``rank``."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    q_first = rank * (heads // tp)
    kv_first = rank * (kv // tp) if kv >= tp else rank // (tp // kv)
    return q_first, kv_first, head_dim


def _copy_linear(dst, src, dim: int, index: int, bias_too: bool) -> None:
    """``dst`` (a shard's Linear) <- the block ``index`` of ``src`` along ``dim`` (0: rows, 1: columns)."""
    size = dst.weight.shape[dim]
    dst.weight.data.copy_(_block(src.weight.data, dim, index, size))
    if dst.bias is not None:
        if dim == 0:
            dst.bias.data.copy_(_block(src.bias.data, 0, index, size))
        else:
            dst.bias.data.copy_(src.bias.data if bias_too else torch.zeros_like(src.bias.data))


def _copy_layer(dst, src, config, tp: int, rank: int) -> None:
    q_first, kv_first, head_dim = _heads(config, tp, rank)
    a, b = dst.self_attn, src.self_attn
    q_heads = a.q_proj.weight.shape[0] // head_dim
    kv_heads = a.k_proj.weight.shape[0] // head_dim
    _copy_linear(a.q_proj, b.q_proj, 0, q_first // q_heads, False)
    _copy_linear(a.k_proj, b.k_proj, 0, kv_first // kv_heads, False)
    _copy_linear(a.v_proj, b.v_proj, 0, kv_first // kv_heads, False)
    _copy_linear(a.o_proj, b.o_proj, 1, q_first // q_heads, rank == 0)
    m, n = dst.mlp, src.mlp
    for name in ("gate_proj", "up_proj"):
        _copy_linear(getattr(m, name), getattr(n, name), 0, rank, False)
    _copy_linear(m.down_proj, n.down_proj, 1, rank, rank == 0)
    for name, child in dst.named_children():
        if name not in ("self_attn", "mlp"):      # the norms: replicated
            child.load_state_dict(getattr(src, name).state_dict())


def shard_weights(lm, tp: int, rank: int, pp: int = 1, stage: int = 0):
    """The model chip (``stage``, ``rank``) runs: ``shard_lm``'s shard of L / pp layers with the
    weights of ``lm``'s layers ``stage x L / pp ..`` sliced for ``rank`` (module docstring). Its
    embedding and head are those of the vocabulary block ``rank`` (every stage holds them, as the
    plan's stage does; only the first stage's embedding and the last stage's head run)."""
    from torchfl.planner.parallel.shard import shard_lm

    layers = lm.config.num_hidden_layers // pp
    shard = shard_lm(lm, tp, layers)
    if shard is lm:
        return lm
    shard = shard.to_empty(device="cpu")
    rotary = shard.model.rotary_emb
    shard.model.rotary_emb = type(rotary)(config=shard.config)       # its tables are buffers to_empty left blank
    with torch.no_grad():
        for i, layer in enumerate(shard.model.layers):
            _copy_layer(layer, lm.model.layers[stage * layers + i], lm.config, tp, rank)
        shard.model.norm.load_state_dict(lm.model.norm.state_dict())
        vocab = shard.config.vocab_size
        shard.model.embed_tokens.weight.data.copy_(_block(lm.model.embed_tokens.weight.data, 0, rank, vocab))
        _copy_linear(shard.lm_head, lm.lm_head, 0, rank, False)
    return shard.eval()
