"""``torchfl plan compare``: one model on several chips, side by side (a decoder's serving speed
with --context)."""

from __future__ import annotations

import click

from torchfl.cli.whatif_cmd.common import (CONTEXT, PROMPT, check_batch, chip_names, common_options, decoder_of,
                                            emit_json, fail, guarded, load, model_options, para, precision_of,
                                            show_bytes, show_time, swept, text_table)
from torchfl.cli.whatif_cmd.serving import decode_text
from torchfl.cluster.options import cluster_option, require_ray, resume_option


@click.command("compare")
@click.argument("model")
@click.option("--chips", default=None, help="Comma-separated chip names (default: every chip in the registry).")
@model_options
@CONTEXT
@PROMPT
@common_options
@cluster_option
@resume_option
@guarded
def compare(model, chips, batch, seq_len, heads, layers, context, prompt, precision, training, registry, as_json,
            cluster, resume):
    """MODEL planned on every chip (or --chips): predicted time, off-chip bytes, peak memory,
    kernels, fusions, fallbacks and the bound resource, fastest first; or what stops it.
    With --context, a causal LM's serving speed: prefill of --prompt tokens, per-token decode
    latency and tokens/s at that context, most tokens/s first. With --cluster, each chip is a
    unit on the Ray cluster, recorded in the registry (--resume RUN)."""
    from torchfl.planner import whatif

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
        res = whatif.compare_decode(module, targets, batch or 1, prompt, context, precision_of(precision))
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


def confidence_cells(r) -> tuple[str, str]:
    """(assumed, checked) cells of a row's confidence: ``62%!`` (``!``: a number the chip's
    file leaves out priced this time as nothing), ``12% on 84`` (out-of-sample mean error on
    that many rows) or ``no``."""
    c = r.get("confidence") or {}
    if not c:
        return "-", "-"
    assumed = f"{100 * c['assumption_share']:.0f}%" + ("!" if c["missing"] else "")
    if c["state"] == "checked" and c["checked_rows"] and c["out_of_sample_mae"] is not None:
        checked = f"{100 * c['out_of_sample_mae']:.0f}% on {c['checked_rows']}"
    else:
        checked = {"stale": "stale", "unknown": "?"}.get(c["state"], "no")
    return assumed, checked


def confidence_legend(rows) -> list[str]:
    """What the two confidence columns and their marks mean (only what the rows show)."""
    text = ("assumed = share of the time priced from numbers of kind assumption or unstated (HCD "
            "provenance); checked = out-of-sample mean error on that many published rows (no: none)")
    if any((r.get("confidence") or {}).get("missing") for r in rows):
        text += ("; ! = the chip's file leaves out a number this time reads (a launch cost, a sustained fraction; "
                 "--json lists them), priced as nothing")
    if any("rank_time_s" in r for r in rows):
        from torchfl.planner.confidence import RANK_RULE

        marked = ", ".join(f"{r['chip']} as {show_time(r['rank_time_s'])}" for r in rows if "rank_time_s" in r)
        text += f"; {RANK_RULE}: {marked}"
    return para(text)


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
    out = [f"{model} ({what}) on {len(res['rows'])} chips, planned in {res['planning_s']:.1f} s (fastest first)"]
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
