"""A Mixtral-style MoE decoder run expert-parallel on emulated chips: two counted all-to-alls a layer.

Chip ``c`` holds experts ``c x E / ep ..`` of every MoE layer (``planner.parallel.experts``: the
layout and the bytes) and the rest of the model whole, and runs batch / ep sequences. Per layer:

1. ``attention`` (``programs._Attention``, the whole layer's heads) and ``route`` (residual, the
   post-attention norm, the router's softmax top-k): compiled programs on the chip;
2. dispatch: each chip packs its normed hidden states into one fixed-capacity buffer per expert
   (a slot per token of the chip, zero where the token is not routed there: GShard's capacity,
   here large enough that nothing is dropped) and the **all-to-all** sends each chip its experts'
   buffers;
3. ``experts``: the chip's experts over every source's buffer (batched matmuls, a compiled program;
   a zero slot gives zero);
4. combine: the **all-to-all** sends the outputs back; each token's output is its top-k experts'
   outputs weighted by the router's weights, the residual added by the next layer's program.

The packing and the weighted sum (index bookkeeping of the two all-to-alls, no model weights) run
on the host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from torchfl.runtime.parallel.links import Counted, Links
from torchfl.runtime.parallel.programs import _Attention, _Embed, _Head, causal_mask, many_shapes, on_chip


class _Route(nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, residual, delta):
        x = residual + delta
        h = self.layer.post_attention_layernorm(x)
        h = h.reshape(-1, h.shape[-1])
        _logits, weights, experts = self.layer.mlp.gate(h)
        return x, h, weights, experts


class _Experts(nn.Module):
    """Experts ``first .. first + count`` of a ``MixtralExperts``, over buffers [count, slots, hidden]."""

    def __init__(self, experts, first: int, count: int):
        super().__init__()
        self.gate_up = nn.Parameter(experts.gate_up_proj.data[first:first + count].clone(), requires_grad=False)
        self.down = nn.Parameter(experts.down_proj.data[first:first + count].clone(), requires_grad=False)
        self.act = experts.act_fn

    def forward(self, buffers):
        gate, up = torch.bmm(buffers, self.gate_up.transpose(1, 2)).chunk(2, dim=-1)
        return torch.bmm(self.act(gate) * up, self.down.transpose(1, 2))


@dataclass
class ExpertRun(Counted):
    """Last-token logits (the chips' rows in batch order), the links' bytes and the plan's."""

    chip: str
    ep: int
    logits: torch.Tensor
    links: dict
    planned: dict
    programs_run: int
    fallbacks: int


def _slots(experts: torch.Tensor, count: int) -> torch.Tensor:
    """Each (token, k)'s slot in its expert's buffer: the token's rank among the expert's tokens."""
    routed = (experts[..., None] == torch.arange(count)).any(1)             # [tokens, experts]
    rank = routed.long().cumsum(0) - 1
    return rank.gather(1, experts)


def _dispatch(h, experts, count: int, ep: int) -> tuple[list, torch.Tensor]:
    """One chip's buffers for each chip ([E / ep, tokens, hidden] each) and its (token, k) slots."""
    slots = _slots(experts, count)
    buffers = h.new_zeros(count, h.shape[0], h.shape[1])
    buffers[experts, slots] = h[:, None, :].expand(-1, experts.shape[1], -1)
    return list(buffers.chunk(ep)), slots


def _combine(outputs: list, experts, slots, weights) -> torch.Tensor:
    """A chip's MoE output: its tokens' top-k expert outputs, weighted and summed."""
    every = torch.cat(outputs)                                                # [E, tokens, hidden]
    picked = every[experts, slots]                                            # [tokens, k, hidden]
    return (picked * weights[..., None].to(picked.dtype)).sum(1)


def _moe_layer(links, chips, routes, expert_programs, count):
    """Dispatch, experts, combine over the chips; each chip's MoE output [tokens, hidden]."""
    ep = len(chips)
    packed = [_dispatch(h, e, count, ep) for _x, h, _w, e in routes]
    got = links.all_to_all(chips, [bufs for bufs, _s in packed])              # got[d][c]
    outs = []
    for d, program in enumerate(expert_programs):
        result = program(torch.cat(got[d], dim=1))                            # [E / ep, ep x tokens, hidden]
        outs.append(list(result.chunk(ep, dim=1)))
    back = links.all_to_all(chips, outs)                                      # back[c][d]
    return [_combine(back[c], routes[c][3], packed[c][1], routes[c][2]) for c in range(ep)]


def run_expert_parallel(model, input_ids, chips: str = "2xH100-SXM5-80GB", precision=None) -> ExpertRun:
    """``model`` (a Hugging Face Mixtral-style causal LM) run expert-parallel on ``chips``."""
    from torchfl.planner.parallel import parse_chips
    from torchfl.planner.parallel.experts import expert_bytes
    from torchfl.runtime.recording import recording

    want = parse_chips(chips)
    ep, cfg = want.count, model.config
    dtype = next(model.parameters()).dtype
    (batch, tokens), count = input_ids.shape, cfg.num_local_experts
    planned = expert_bytes(cfg, ep, batch, tokens, dtype.itemsize)["link_bytes"]   # refuses a bad ep first

    def compiled(module):
        return on_chip(module.eval(), want.chip, precision)

    body, chips_ = model.eval().model, list(range(ep))
    per, local = batch // ep, count // ep
    ids = list(input_ids.chunk(ep))
    positions, mask = torch.arange(tokens).expand(per, tokens), causal_mask(tokens, dtype)
    links = Links()
    with torch.no_grad(), recording() as rec, many_shapes():
        embed = compiled(_Embed(body.embed_tokens, 0))
        delta = [embed(i) for i in ids]
        residual = [torch.zeros_like(d) for d in delta]
        for layer in body.layers:
            attention, route = compiled(_Attention(layer, body.rotary_emb)), compiled(_Route(layer))
            attended = [attention(r, d, positions, mask) for r, d in zip(residual, delta)]
            routes = [route(x, a) for x, a in attended]
            experts = [compiled(_Experts(layer.mlp.experts, c * local, local)) for c in chips_]
            moe = _moe_layer(links, chips_, routes, experts, count)
            residual = [x for x, _h, _w, _e in routes]
            delta = [m.reshape(per, tokens, -1) for m in moe]
        head = compiled(_Head(body.norm, model.lm_head))
        logits = torch.cat([head(r, d) for r, d in zip(residual, delta)])
    fallbacks = sum(plan.summary.fallbacks for _g, plan, _r in rec.entries)
    return ExpertRun(want.chip, ep, logits, links.report(), planned, len(rec.entries), fallbacks)
