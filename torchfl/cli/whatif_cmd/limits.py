"""``torchfl plan max-batch|max-context``: the largest batch, the longest context, that fits a chip."""

from __future__ import annotations

import sys

import click

from torchfl.cli.whatif_cmd.common import (CONTEXT, check_batch, common_options, decoder_of, echo_wrapped, emit_json,
                                            guarded, load, para, precision_of, precision_text, progress_notes,
                                            show_bytes, text_table)
from torchfl.hcd.dtypes import PRECISION_CHOICES


@click.command("max-batch")
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. EDGE-C2.")
@click.option("--seq-len", type=click.IntRange(min=1), default=None, help="Sequence length (BERT, GPT-2).")
@click.option("--heads", type=click.IntRange(min=1), default=None, help="Attention heads (BERT, GPT-2).")
@click.option("--layers", type=click.IntRange(min=1), default=None, help="Encoder/decoder layers (BERT, GPT-2).")
@CONTEXT
@common_options
@guarded
def max_batch(model, chip, seq_len, heads, layers, context, precision, training, registry, as_json):
    """The largest batch of MODEL whose plan fits --chip (off-chip memory, max_batch_size,
    sequence length), found by planning at a few batches (nothing runs); names the limit.
    With --context, a causal LM's decode step at that context (its KV cache grows with the batch)."""
    from torchfl.planner import whatif

    target = whatif.chip_of(chip, registry)
    check_batch(None, [target], seq_len)
    module, inputs = load(model, 1, seq_len, heads, layers)
    progress = None if as_json else progress_notes("max-batch")
    if context:
        dec = decoder_of(model, module, training)
        res = whatif.max_batch_at_context(module, target, context, precision_of(precision), progress, dec)
        model = f"{model} (decode step at context {context})"
    else:
        res = whatif.max_batch(module, inputs, target, precision_of(precision), training, progress=progress)
    if as_json:
        emit_json(dict(res.to_dict(), model=model))
        return
    what = "training step" if training else "inference"
    if res.batch == 0:
        click.echo("\n".join(para(f"{model} ({what}) does not fit {res.chip} {res.version} even at batch 1: "
                                   f"{res.limit}")))
        click.echo("\n".join(para(res.reason, indent="  ")))
        sys.exit(1)
    peak = f", peak {show_bytes(res.peak_bytes)}" + (f" of {show_bytes(res.capacity_bytes)}" if res.capacity_bytes else "")
    click.echo("\n".join(para(f"max batch of {model} ({what}, precision {precision_text(res.precision, module)}) on "
                               f"{res.chip} {res.version}: {res.batch}{peak}")))
    click.echo(f"limited by: {res.limit}")
    click.echo("\n".join(para(res.reason.splitlines()[0], indent="  ")))
    rows = [(p.batch, "fits" if p.ok else f"refused: {p.limit}", show_bytes(p.peak_bytes), f"{p.seconds:.1f} s")
            for p in sorted(res.probes, key=lambda p: p.batch)]
    click.echo("\n".join(text_table(rows, ("batch", "plan", "peak", "planning"), right=(0, 2, 3))))


@click.command("max-context")
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. EDGE-C2.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences decoded at once.")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
              help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16).")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@guarded
def max_context(model, chip, batch, precision, registry, as_json):
    """The longest context of the causal LM MODEL whose decode step fits --chip at --batch
    (the KV cache grows with every token), found by planning (nothing runs); names the limit:
    the off-chip memory, the chip's sequence limits or the model's positions."""
    from torchfl.planner import whatif

    module, _inputs = load(model)
    dec = decoder_of(model, module, False, asked_by="plan max-context")
    target = whatif.chip_of(chip, registry)
    res = whatif.max_context(module, target, batch, precision_of(precision),
                             None if as_json else _context_progress, dec)
    if as_json:
        data = res.to_dict()
        # a probe is a context length here (the planner's shared Probe calls it batch)
        data["probes"] = [{("context" if k == "batch" else k): v for k, v in p.items()} for p in data["probes"]]
        emit_json(dict(data, model=model))
        return
    if res.context == 0:
        echo_wrapped(f"{model} does not fit {res.chip} {res.version} at batch {batch} even with a short context: "
              f"{res.limit}")
        echo_wrapped(res.reason.splitlines()[0], indent="  ")
        sys.exit(1)
    peak = f", peak {show_bytes(res.peak_bytes)}" + (f" of {show_bytes(res.capacity_bytes)}" if res.capacity_bytes else "")
    echo_wrapped(f"max context of {model} (batch {batch}, precision {precision_text(res.precision, module)}) on {res.chip} "
          f"{res.version}: {res.context} tokens{peak}, KV cache {show_bytes(res.kv_cache_bytes)}")
    click.echo(f"limited by: {res.limit}")
    echo_wrapped(res.reason.splitlines()[0], indent="  ")
    rows = [(p.batch, "fits" if p.ok else f"refused: {p.limit}", show_bytes(p.peak_bytes), f"{p.seconds:.1f} s")
            for p in sorted(res.probes, key=lambda p: p.batch)]
    click.echo("\n".join(text_table(rows, ("context", "plan", "peak", "planning"), right=(0, 2, 3))))


def _context_progress(item):
    state = "fits" if item.ok else f"refused ({item.limit})"
    click.echo(f"max-context: context {item.batch}: {state}, peak {show_bytes(item.peak_bytes)} ({item.seconds:.1f} s)",
               err=True)
