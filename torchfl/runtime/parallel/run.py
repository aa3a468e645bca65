"""A decoder LM's forward split over tp x pp emulated chips, with every collective the plan prices.

Chip ``stage x tp + rank`` holds rank ``rank``'s tensor-parallel shard of pipeline stage ``stage``
(``weights.shard_weights``) and runs its compiled programs (``programs.ChipProgram``). The steps
are the plan's (``planner.parallel.split``), in its order:

1. stage 0: every chip looks up its vocabulary block; **all-reduce** (the plan's "one after the
   embedding");
2. per layer: the attention programs, **all-reduce** of the o_proj partial sums; the MLP programs,
   **all-reduce** of the down_proj partial sums (the plan's "two a layer");
3. between stages: each rank finishes its residual and **sends** it to the same rank of the next
   stage (the plan's pp - 1 hand-offs, one per rank);
4. last stage: each chip's logits of its vocabulary block for the last token; **all-gather**.

The bytes the :class:`~torchfl.runtime.parallel.links.Links` counted are compared with the plan's
schedule (``planner.parallel.split.collective_bytes``): ``SplitRun.planned`` is that function's
``link_bytes``, read, not recomputed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from torchfl.runtime.parallel.links import Counted, Links
from torchfl.runtime.parallel.programs import ChipProgram, causal_mask, many_shapes


@dataclass
class SplitRun(Counted):
    """What a split run returns: the gathered last-token logits, the links' bytes and the plan's."""

    chip: str
    tp: int
    pp: int
    logits: torch.Tensor                     # [batch, vocab], every chip's copy equal
    links: dict                              # Links.report()
    planned: dict                            # collective_bytes(...)["link_bytes"]
    copies_equal: bool = field(default=True)   # every chip of the last stage gathered the same logits
    programs_run: int = 0                       # compiled chip programs executed (the recorder's entries)
    fallbacks: int = 0                          # ops of those programs' plans that ran on the host

    def table(self) -> str:
        """The per-kind and per-link bytes as text (what the docs show)."""
        rows = [f"{self.tp * self.pp}x{self.chip}, tp {self.tp} x pp {self.pp}",
                f"{'collective':<11} {'planned B':>10} {'counted B':>10}"]
        rows += [f"{k:<11} {int(self.planned[k]):>10} {self.counted[k]:>10}" for k in self.planned]
        rows.append("links: " + ", ".join(f"{k} {v} B" for k, v in self.links["links"].items()))
        return "\n".join(rows)


def _check(model, chips, tp, pp):
    """(chip name, tp, pp) of a request, or a one-line refusal (ShardError, ParallelError)."""
    from torchfl.planner.parallel import ParallelError, parse_chips, shard_config

    want = parse_chips(chips) if isinstance(chips, str) else chips
    tp = tp or max(1, want.count // pp)
    if tp * pp != want.count:
        raise ParallelError(f"tp {tp} x pp {pp} = {tp * pp} chips, but chips={chips!r} gives {want.count}; "
                            f"choose tp x pp = {want.count}")
    layers = model.config.num_hidden_layers
    if layers % pp:
        raise ParallelError(f"pp {pp} does not divide the model's {layers} layers; use a pp that divides {layers}")
    shard_config(model.config, tp)           # ShardError: tp does not divide the heads, MLP or vocabulary
    return want.chip, tp, pp


def _stage_layers(programs, links: Links, group, residual, delta, positions, mask):
    """One stage's layers over its tp chips: (residuals, all-reduced deltas) after the last layer."""
    for layer in range(len(programs[0].layers)):
        for part in (0, 1):
            outs = [p.layers[layer][part](*((r, d, positions, mask) if part == 0 else (r, d)))
                    for p, r, d in zip(programs, residual, delta)]
            residual = [o[0] for o in outs]
            delta = links.all_reduce(group, [o[1] for o in outs])
    return residual, delta


def run_split(model, input_ids, chips: str = "2xH100-SXM5-80GB", tp: int | None = None, pp: int = 1,
              precision=None) -> SplitRun:
    """``model`` (a Hugging Face LLaMA-family causal LM, on the host) run on ``chips`` emulated chips
    split ``tp`` x ``pp`` (tp defaults to chips / pp): the last token's logits, equal to the unsplit
    model's up to the sums' order, and the bytes every link carried against the plan's."""
    from torchfl.planner.parallel.split import Split, collective_bytes
    from torchfl.runtime.parallel.weights import shard_weights
    from torchfl.runtime.recording import recording

    chip, tp, pp = _check(model, chips, tp, pp)
    model = model.eval()
    dtype = next(model.parameters()).dtype
    batch, tokens = input_ids.shape
    groups = [[s * tp + r for r in range(tp)] for s in range(pp)]
    links = Links()
    positions = torch.arange(tokens).expand(batch, tokens)
    mask = causal_mask(tokens, dtype)
    with torch.no_grad(), recording() as rec, many_shapes():
        stages = [[ChipProgram(shard_weights(model, tp, r, pp, s), chip, r, precision) for r in range(tp)]
                  for s in range(pp)]
        delta = links.all_reduce(groups[0], [p.embed(input_ids) for p in stages[0]])
        residual = [torch.zeros_like(d) for d in delta]
        for s, programs in enumerate(stages):
            if s:
                finished = [p.finish(r, d) for p, r, d in zip(stages[s - 1], residual, delta)]
                residual = links.exchange(list(zip(groups[s - 1], groups[s])), finished)
                delta = [torch.zeros_like(x) for x in residual]
            residual, delta = _stage_layers(programs, links, groups[s], residual, delta, positions, mask)
        blocks = [p.head(r, d) for p, r, d in zip(stages[-1], residual, delta)]
        gathered = links.all_gather(groups[-1], blocks)
    planned = collective_bytes(model.config, Split(tp, pp), batch, tokens, dtype.itemsize)["link_bytes"]
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    fallbacks = sum(plan.summary.fallbacks for _graph, plan, _record in rec.entries)
    return SplitRun(chip, tp, pp, gathered[0], links.report(), planned, same, len(rec.entries), fallbacks)
