"""``torchfl plan compare``: one model on several chips, side by side (a decoder's serving speed
with --context)."""

from __future__ import annotations

import click

from torchfl.cli.whatif_cmd.common import (CONTEXT, PROMPT, check_batch, chip_names, common_options, decoder_of,
                                            emit_json, fail, guarded, load, model_options, para, precision_of,
                                            show_bytes, show_time, swept, text_table)
from torchfl.cli.whatif_cmd.chips import SYSTEMS, compare_systems, systems_text
from torchfl.cli.whatif_cmd.confidence import confidence_cells, confidence_legend
from torchfl.cli.whatif_cmd.serving import ENGINE, KV_CACHE, decode_text, engine_of
from torchfl.cluster.options import cluster_option, require_ray, resume_option


@click.command("compare")
@click.argument("model")
@click.option("--chips", default=None, help="Comma-separated chip names (default: every chip in the registry).")
@SYSTEMS
@model_options
@CONTEXT
@PROMPT
@ENGINE
@KV_CACHE
@common_options
@cluster_option
@resume_option
@guarded
def compare(model, chips, systems, batch, seq_len, heads, layers, context, prompt, engine, kv_cache, precision, training,
            registry, as_json, cluster, resume):
    """MODEL planned on every chip (or --chips): predicted time, off-chip bytes, peak memory,
    kernels, fusions, fallbacks and the bound resource, fastest first; or what stops it.
    With --context, a causal LM's serving speed: prefill of --prompt tokens, per-token decode
    latency and tokens/s at that context, most tokens/s first, under the engine behaviour
    --engine and --kv-cache say. Each row says what share of its time assumed numbers priced
    and how well the chip is checked out of sample. With --cluster, each chip is a
    unit on the Ray cluster, recorded in the registry (--resume RUN). With --systems
    8xA100-SXM4-80GB,8xH100-SXM5-80GB and --context: the decoder split over each system's chips,
    ranked by tokens/s (and tokens/s per chip)."""
    from torchfl.planner import whatif

    if systems:
        if chips or cluster is not None or resume is not None or not context or training:
            fail("Error", "--systems compares a decoder's serving speed on multi-chip systems: give --context, "
                          "without --chips, --cluster, --resume or --training")
        module, _inputs = load(model, 1, seq_len, heads, layers)
        decoder_of(model, module, False, asked_by="--systems")
        res = compare_systems(model, module, systems, batch or 1, context, prompt, precision_of(precision),
                              engine_of(engine, kv_cache), registry)
        if as_json:
            emit_json(dict(res, model=model))
        else:
            click.echo(systems_text(model, res))
        return
    require_ray(cluster)
    names = chip_names(chips, registry)
    targets = [whatif.chip_of(n, registry) for n in names]
    check_batch(batch, targets, seq_len)
    if (cluster is not None or resume is not None) and context:
        fail("Error", "--cluster/--resume plan compare without --context (a decode comparison runs here)", code=2)
    if cluster is not None or resume is not None:
        from torchfl.cluster.whatif import check_model, sweep_compare

        check_model(model)
        size = dict(batch=batch, seq_len=seq_len, heads=heads, layers=layers)
        res = swept(cluster, resume, registry, lambda **kw: sweep_compare(
            model, size, names, precision=precision_of(precision), training=training, **kw))
        if as_json:
            emit_json(dict(res, model=model))
            return
        click.echo(_compare_text(model, res))
        return
    module, inputs = load(model, 1 if context else batch, seq_len, heads, layers)
    if context:
        decoder_of(model, module, training)
        res = whatif.compare_decode(module, targets, batch or 1, prompt, context, precision_of(precision),
                                    engine_of(engine, kv_cache), registry)
        if as_json:
            emit_json(dict(res, model=model))
        else:
            click.echo(decode_text(model, res))
        return
    res = whatif.compare(module, inputs, targets, precision_of(precision), training, registry)
    if as_json:
        emit_json(dict(res, model=model))
        return
    click.echo(_compare_text(model, res))


def _compare_text(model, res) -> str:
    rows, errors = [], []
    for r in res["rows"]:
        if r["ok"]:
            cap = show_bytes(r["capacity_bytes"]) if r["capacity_bytes"] else "-"
            rows.append((r["chip"], r["version"], r["precision"] or "-", show_time(r["per_call_time_s"]),
                         " ".join(confidence_cells(r)), show_time(r["run_once_time_s"]), show_bytes(r["per_call_bytes"]),
                         show_bytes(r["peak_bytes"]), cap, r["kernels"], r["fused_groups"], r["conversions"],
                         r["fallbacks"], f"{r['bound']} ({100 * r['bound_share']:.0f}%)"))
        else:
            errors += para(f"{r['chip']} {r['version']}: {r['error_kind']}: {r['error'].splitlines()[0]}",
                            indent="  ", subsequent="    ")
    what = "training step" if res["training"] else "inference"
    order = "fastest first" + ("; chips with numbers left out ranked by the rule below"
                               if any("rank_time_s" in r for r in res["rows"]) else "")
    out = para(f"{model} ({what}) on {len(res['rows'])} chips, planned in {res['planning_s']:.1f} s ({order})")
    # "per call": what every call pays; "run once": parameter casts and layout copies kept on the chip
    out += text_table(rows, ("chip", "version", "precision", "per call", "assumed, checked", "run once",
                             "off-chip per call", "peak memory", "capacity", "kernels", "fused", "layout conversions",
                             "fallbacks", "bound by"),
                      right=(3, 5, 6, 7, 8, 9, 10, 11, 12), optional=(10, 9, 8, 1, 6, 11, 5))
    if rows:
        out += confidence_legend([r for r in res["rows"] if r["ok"]])
    if errors:
        out.append(f"Not plannable ({sum(not r['ok'] for r in res['rows'])}):")
        out += errors
    return "\n".join(out)
