"""What one emulated chip runs between two collectives: its shard cut at the plan's collective steps.

A tensor-parallel layer is two chip programs, each ending where the plan puts an all-reduce:

* ``attention``: residual + the all-reduced delta (the previous step's sum), input norm, rotary,
  the chip's query/key/value heads, attention, the row-parallel o_proj: a *partial* sum;
* ``mlp``: residual + the all-reduced attention output, post-attention norm, gate/up columns, the
  row-parallel down_proj: a partial sum.

and around them ``embed`` (the vocabulary block's lookup, zero rows for ids outside it: their sum
over the chips, the all-reduce, is the full embedding), ``finish`` (the last residual add before a
pipeline hand-off) and ``head`` (final norm and the vocabulary block's logits of the last token,
the block the all-gather joins). Taking the residual add into the next program keeps every
addition on the chip; adding the all-reduced sum to a zero residual (the first layer) or a zero
delta (a stage's first layer) is exact.

Each program is compiled with the torchfl backend for the chip (``torch.compile(...,
backend="torchfl")``): one plan per program on the chip's HCD, run by the emulator. Programs of
the same structure share Dynamo's graph (parameters are graph inputs), so a tp 4 run plans each
kind of program once per shape, not once per chip.
"""

from __future__ import annotations

import torch
from torch import nn


class _Embed(nn.Module):
    def __init__(self, embedding, first: int):
        super().__init__()
        self.embedding, self.rows = embedding, embedding.weight.shape[0]
        # a tensor, not an int: Dynamo specialises on int attributes (one graph per rank)
        self.register_buffer("first", torch.tensor(first), persistent=False)

    def forward(self, ids):
        local = ids - self.first
        inside = (local >= 0) & (local < self.rows)
        x = self.embedding(local.clamp(0, self.rows - 1))
        return x * inside.unsqueeze(-1).to(x.dtype)


class _Attention(nn.Module):
    def __init__(self, layer, rotary):
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, residual, delta, positions, mask):
        x = residual + delta
        h = self.layer.input_layernorm(x)
        out, _ = self.layer.self_attn(h, self.rotary(h, positions), mask)
        return x, out


class _Mlp(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, residual, delta):
        x = residual + delta
        return x, self.layer.mlp(self.layer.post_attention_layernorm(x))


class _Finish(nn.Module):
    def forward(self, residual, delta):
        return residual + delta


class _Head(nn.Module):
    def __init__(self, norm, head):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, residual, delta):
        x = (residual + delta)[:, -1, :]
        return self.head(self.norm(x))


def on_chip(module, chip: str, precision=None):
    """``module`` compiled with the torchfl backend for ``chip`` (static shapes: one plan per shape)."""
    options = {"chip": chip} if precision is None else {"chip": chip, "precision": precision}
    return torch.compile(module, backend="torchfl", options=options, dynamic=False)


def many_shapes():
    """A context allowing 64 graphs per program (Dynamo's default is 8 per code object). Every shape,
    dtype and weight layout a program meets is one graph (tp 1/2/4, float16, a Mixtral's attention...);
    past the limit Dynamo would run the program eagerly on the host without saying so."""
    import torch._dynamo

    return torch._dynamo.config.patch(recompile_limit=64)


class ChipProgram:
    """The compiled programs of one chip (its shard of one stage), in the order the layers run."""

    def __init__(self, shard, chip: str, rank: int, precision=None):
        def compiled(module):
            return on_chip(module.eval(), chip, precision)

        body = shard.model
        self.embed = compiled(_Embed(body.embed_tokens, rank * body.embed_tokens.weight.shape[0]))
        self.layers = [(compiled(_Attention(layer, body.rotary_emb)), compiled(_Mlp(layer))) for layer in body.layers]
        self.finish = compiled(_Finish())
        self.head = compiled(_Head(body.norm, shard.lm_head))


def causal_mask(tokens: int, dtype) -> torch.Tensor:
    """The additive causal mask the attention programs take (the dtype's lowest value above the
    diagonal, as Hugging Face builds it): explicit, so no attention implementation's default decides."""
    return torch.full((tokens, tokens), torch.finfo(dtype).min, dtype=dtype).triu(1)[None, None]
