"""``torchfl plan memory``: the peak device memory of a model's plan, and what is live then."""

from __future__ import annotations

import click

from torchfl.cli.whatif_cmd.chips import CHIPS, EP, PP, SYSTEM, TP, chip_or_chips, emit, run_parallel
from torchfl.cli.whatif_cmd.common import (CONTEXT, check_batch, common_options, decoder_of, emit_json, fail, guarded,
                                            load, model_options, para, precision_of, precision_text, show_bytes,
                                            text_table)


@click.command("memory")
@click.argument("model")
@click.option("--chip", default=None, help="Chip name in the registry, e.g. NPU-V3 (or --chips).")
@CHIPS
@SYSTEM
@TP
@PP
@EP
@model_options
@CONTEXT
@common_options
@guarded
def memory(model, chip, chips, system, tp, pp, ep, batch, seq_len, heads, layers, context, precision, training, registry,
           as_json):
    """Peak device memory of MODEL's plan on --chip, the step where it occurs and what is live
    then (inputs, parameters, weights in the plan's dtype, activations, outputs; with
    --context, a decoder's decode step and its KV cache per layer). With --chips NxCHIP or --system
    NAME|FILE: a decoder's decode step (at --context, default 2048) split over N chips: the memory
    per chip and the split."""
    from torchfl.planner import whatif

    chip_or_chips(chip, chips, tp, pp, system, ep)
    if chips or system:
        module, _inputs = load(model, 1, seq_len, heads, layers)
        r = run_parallel(model, module, chips, tp, pp, batch or 1, context or 2048, None, precision_of(precision),
                         None, registry, system, ep)
        return emit(model, r, as_json, "memory")
    target = whatif.chip_of(chip, registry)
    check_batch(batch, [target], seq_len)
    module, inputs = load(model, 1 if context else batch, seq_len, heads, layers)
    if context:
        dec = decoder_of(model, module, training)
        p = whatif.plan_decode(target, dec, batch or 1, context, precision_of(precision))
        model = f"{model} (decode step, batch {batch or 1}, context {context})"
    else:
        (p,) = whatif.plan_everywhere(module, inputs, [target], precision_of(precision), training)
    mp = p.plan.memory if p.ok else getattr(p.error, "memory", None)
    if mp is None:
        raise p.error
    plans = [x for x in (p.plan, p.backward) if x is not None]
    if as_json:
        data = {"model": model, "chip": p.chip, "version": p.version, "precision": p.precision,
                "training": training, "fits": p.ok, "error": None if p.ok else str(p.error),
                "peak_bytes": p.peak_bytes if p.ok else mp.peak_bytes, "capacity_bytes": mp.capacity,
                "graphs": [_memory_json(x.memory, x) for x in plans] if p.ok else [_memory_json(mp, None)]}
        emit_json(data)
    else:
        click.echo(f"{model} on {p.chip} {p.version} (precision {precision_text(p.precision, module)}"
                   f"{', training step' if training else ''})")
        if p.ok:
            for name, x in zip(("forward", "backward") if training else ("inference",), plans):
                click.echo(_memory_text(x.memory, x, name))
            if training:
                click.echo("\n".join(para(f"Training step high-water: {show_bytes(p.peak_bytes)} (the forward's cached "
                                           "weights stay resident while the backward runs)")))
        else:
            click.echo(_memory_text(mp, None, "plan"))
    if not p.ok:
        fail(p.error.kind, str(p.error))


def _memory_json(mp, plan) -> dict:
    from torchfl.planner.memory import kv_cache_table

    d = mp.to_dict()
    if plan is not None:
        d["kv_cache"] = kv_cache_table(plan)
    d["breakdown_at_peak"] = mp.breakdown()
    d["largest_at_peak"] = [b.to_dict() for b in mp.live_at_peak()[:10]]
    if plan is not None and mp.peak_step >= 0:
        s = plan.steps[mp.peak_step]
        d["peak_step_detail"] = {"index": s.index, "kind": s.kind, "kernel": s.kernel, "nodes": list(s.nodes)}
    return d


def _memory_text(mp, plan, name) -> str:
    from torchfl.planner.memory import WHY

    where = "during the uploads (before step 0)" if mp.peak_step < 0 else f"at step {mp.peak_step}"
    if plan is not None and mp.peak_step >= 0:
        s = plan.steps[mp.peak_step]
        where += f" ({s.kernel or s.kind}{' ' + s.nodes[-1] if s.nodes else ''})"
    cap = "capacity unbounded (no off_chip_memory.size_gb)" if mp.capacity is None else \
        f"capacity {show_bytes(mp.capacity)}: {100 * mp.peak_bytes / mp.capacity:.1f}% used"
    lines = para(f"{name}: peak {show_bytes(mp.peak_bytes)} ({mp.peak_bytes:,} B) {where}; {cap}; "
                  f"{show_bytes(mp.resident_bytes)} resident between calls; buffers aligned to {mp.alignment} B")
    rows = [(k, show_bytes(n), f"{n:,}", WHY[k]) for k, n in mp.breakdown().items() if n]
    lines += ["  " + x for x in text_table(rows, ("live at peak", "size", "bytes", "what"), right=(1, 2), indent=2)]
    top = mp.live_at_peak()[:8]
    rows = [(b.name, b.kind, show_bytes(b.nbytes), "before step 0" if b.alloc < 0 else f"step {b.alloc}",
             "kept" if b.free is None else ("after return" if plan is not None and b.free >= len(plan.steps)
                                            else f"after step {b.free}")) for b in top]
    lines += ["  " + x for x in text_table(rows, ("largest buffers at peak", "kind", "size", "allocated", "freed"),
                                       right=(2,), indent=2)]
    if plan is not None:
        from torchfl.planner.memory import kv_cache_table

        cache = kv_cache_table(plan)
        if cache:
            total = sum(c["bytes"] for c in cache)
            lines += para(f"KV cache: {show_bytes(total)} in {len({c['layer'] for c in cache})} layers (the grown cache "
                           "the step returns; the past it reads is freed layer by layer)", indent="  ")
            rows = [(c["layer"], c["kind"], "x".join(map(str, c["shape"])), c["dtype"], show_bytes(c["bytes"])) for c in cache]
            lines += ["  " + x for x in text_table(rows, ("layer", "cache", "shape [B, heads, positions, dim]", "dtype",
                                                     "size"), right=(0, 4), indent=2)]
    return "\n".join(lines)
