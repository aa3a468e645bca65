"""``torchfl plan decode``: a causal LM's predicted serving speed on one chip."""

from __future__ import annotations

import sys

import click

from torchfl.cli.whatif_cmd.common import (PROMPT, decoder_of, echo_wrapped, emit_json, fail, guarded, load, para,
                                            precision_of, precision_text, show_bytes, show_time, text_table)
from torchfl.cli.whatif_cmd.chips import CHIPS, EP, PP, SYSTEM, TP, chip_or_chips, emit, run_parallel
from torchfl.cli.whatif_cmd.confidence import confidence_cells, confidence_legend, confidence_sentence
from torchfl.hcd.dtypes import PRECISION_CHOICES


ENGINE = click.option("--engine", type=click.Choice(("eager", "graph")), default="eager", show_default=True,
                      help="How the serving engine submits kernels: eager (one host call and sync per kernel, "
                           "as HF generate) or graph (the step enqueued at once: CUDA Graphs, vLLM, TensorRT-LLM).")
KV_CACHE = click.option("--kv-cache", "kv_cache", type=click.Choice(("copied", "paged")), default="copied",
                        show_default=True, help="How the KV cache grows: copied each step (torch.cat, HF's "
                                                "DynamicCache) or paged in place (vLLM: only the new token written).")


def engine_of(engine: str, kv_cache: str):
    from torchfl.planner.whatif import Engine

    return Engine(engine, kv_cache)


@click.command("decode")
@click.argument("model")
@click.option("--chip", default=None, help="Chip name in the registry, e.g. TFL-X1 (or --chips).")
@CHIPS
@SYSTEM
@TP
@PP
@EP
@click.option("--context", type=click.IntRange(min=2), required=True,
              help="Cached positions after the decode step (the KV cache's length).")
@PROMPT
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences decoded at once.")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
              help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16).")
@ENGINE
@KV_CACHE
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@guarded
def decode(model, chip, chips, system, tp, pp, ep, context, prompt, batch, precision, engine, kv_cache, registry, as_json):
    """Predicted serving speed of the causal LM MODEL on --chip: the prefill latency of --prompt
    tokens (time to first token), the per-token decode latency at --context and tokens/s, the
    decode step's memory with its KV cache, what bounds the step and how far the prediction
    stands on assumed numbers. The first line states the engine behaviour assumed (--engine,
    --kv-cache; host work between steps is not modelled). With --chips NxCHIP or --system NAME|FILE: the model split
    tensor/pipeline parallel over N chips (--tp/--pp, else chosen by cost), its collectives priced
    from the chip's interconnect."""
    from torchfl.planner import whatif
    from torchfl.planner.confidence import fidelity_evidence

    chip_or_chips(chip, chips, tp, pp, system, ep)
    module, _inputs = load(model)
    if chips or system:
        r = run_parallel(model, module, chips, tp, pp, batch, context, prompt, precision_of(precision),
                         engine_of(engine, kv_cache), registry, system, ep)
        return emit(model, r, as_json, "decode")
    dec = decoder_of(model, module, False, asked_by="plan decode")
    target = whatif.chip_of(chip, registry)
    r = whatif.decode_row(target, dec, batch, prompt, context, precision_of(precision),
                          engine=engine_of(engine, kv_cache), evidence=fidelity_evidence(registry, [target.name]))
    if as_json:
        emit_json(dict(r, model=model))
        if not r["ok"]:
            sys.exit(1)
        return
    if not r["ok"]:
        fail(r["error_kind"], r["error"])
    cap = f" of {show_bytes(r['capacity_bytes'])}" if r["capacity_bytes"] else ""
    echo_wrapped(f"{model} on {r['chip']} {r['version']} (precision {precision_text(r['precision'], module)}, batch {batch}; "
                 f"{r['assumes']}; predicted by the plans' cost model)")
    echo_wrapped(f"prefill of {prompt} tokens (time to first token): {show_time(r['prefill_s'])}", indent="  ")
    echo_wrapped(f"decode at context {context}: {decode_speed(r)}", indent="  ")
    echo_wrapped(f"decode step memory: peak {show_bytes(r['peak_bytes'])}{cap}, KV cache {show_bytes(r['kv_cache_bytes'])}; "
                 f"{r['decode_fallbacks']} fallbacks to CPU per token", indent="  ")
    if r.get("experts"):
        ex = r["experts"]
        echo_wrapped(f"experts: all {ex['per_layer']} of each layer held in memory ({show_bytes(ex['expert_bytes'])}); "
                     f"a step of {batch} token{'s' if batch != 1 else ''} reads at most {ex['read_per_layer']} of them "
                     f"per layer ({show_bytes(ex['read_bytes'])}, top-{ex['active_per_token']} routing)", indent="  ")
    echo_wrapped(confidence_sentence(r["confidence"]), indent="  ")


def decode_speed(r) -> str:
    """``1.2 ms per token, 833.3 tokens/s (launch-bound, 62% of the step's time)``, or, for a step
    with CPU fallbacks, the lower bound and why no tokens/s."""
    bound = f"{r['bound']}-bound, {100 * r['bound_share']:.0f}% of the step's time"
    if r["tokens_per_s"] is None:
        return (f"at least {show_time(r['decode_s'])} per token ({bound}); no tokens/s: {r['decode_fallbacks']} ops "
                "fall back to the CPU each step, their transfers priced but not their host work")
    return f"{show_time(r['decode_s'])} per token, {r['tokens_per_s']:,.1f} tokens/s ({bound})"


def decode_text(model, res) -> str:
    rows, errors = [], []
    for r in res["rows"]:
        if r["ok"]:
            mem = show_bytes(r["peak_bytes"]) + (f" / {show_bytes(r['capacity_bytes'])}" if r["capacity_bytes"] else "")
            rows.append((r["chip"], r["version"], r["precision"] or "-", show_time(r["prefill_s"]),
                         show_time(r["decode_s"]) if r["tokens_per_s"] is not None else f">= {show_time(r['decode_s'])}",
                         f"{r['tokens_per_s']:,.1f}" if r["tokens_per_s"] is not None else "-",
                         " ".join(confidence_cells(r)), show_bytes(r["kv_cache_bytes"]), mem, r["fallbacks"],
                         f"{r['bound']} ({100 * r['bound_share']:.0f}%)"))
        else:
            errors += para(f"{r['chip']} {r['version']}: {r['error_kind']}: {r['error'].splitlines()[0]}",
                            indent="  ", subsequent="    ")
    out = para(f"{model}: batch {res['batch']}, prefill of {res['prompt']} tokens, decode at context "
                f"{res['context']} on {len(res['rows'])} chips, planned in {res['planning_s']:.1f} s (most tokens/s "
                f"first; predicted; {res['assumes']})")
    out += text_table(rows, ("chip", "version", "precision", "prefill", "per token", "tokens/s", "assumed, checked",
                             "KV cache", "peak memory", "fallbacks", "decode bound by"), right=(3, 4, 5, 7, 9),
                      optional=(1, 9, 8))
    if rows:
        out += confidence_legend([r for r in res["rows"] if r["ok"]])
    eager = [r["chip"] for r in res["rows"] if r["ok"] and "eager launch costs kept" in r["assumes"]]
    if eager:
        out += para(f"graph submission asked, but {', '.join(eager)} state no execution.graph_launch_overhead_us: "
                    "their eager launch costs kept")
    if any(r["ok"] and r["tokens_per_s"] is None for r in res["rows"]):
        out += para(">= = a decode step with CPU fallbacks: their transfers priced, not their host work; no tokens/s")
    if errors:
        out.append(f"Not plannable ({sum(not r['ok'] for r in res['rows'])}):")
        out += errors
    return "\n".join(out)
