"""``torchfl plan decode``: a causal LM's predicted serving speed on one chip."""

from __future__ import annotations

import sys

import click

from torchfl.cli.whatif_cmd.common import (PROMPT, decoder_of, echo_wrapped, emit_json, fail, guarded, load, para,
                                            precision_of, show_bytes, show_time, text_table)
from torchfl.hcd.dtypes import PRECISION_CHOICES


@click.command("decode")
@click.argument("model")
@click.option("--chip", required=True, help="Chip name in the registry, e.g. TFL-X1.")
@click.option("--context", type=click.IntRange(min=2), required=True,
              help="Cached positions after the decode step (the KV cache's length).")
@PROMPT
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True, help="Sequences decoded at once.")
@click.option("--precision", type=click.Choice(PRECISION_CHOICES), default="auto", show_default=True,
              help="Precision policy; auto: none on chips with an fp32 unit, else float16 (or bfloat16).")
@click.option("--registry", default=None, help="Registry URL (default: TORCHFL_REGISTRY_URL or the user's).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@guarded
def decode(model, chip, context, prompt, batch, precision, registry, as_json):
    """Predicted serving speed of the causal LM MODEL on --chip: the prefill latency of --prompt
    tokens (time to first token), the per-token decode latency at --context and tokens/s, the
    decode step's memory with its KV cache; then the decode step's plan."""
    from torchfl.planner import whatif

    module, _inputs = load(model)
    dec = decoder_of(model, module, False)
    target = whatif.chip_of(chip, registry)
    r = whatif.decode_row(target, dec, batch, prompt, context, precision_of(precision))
    if as_json:
        emit_json(dict(r, model=model))
        if not r["ok"]:
            sys.exit(1)
        return
    if not r["ok"]:
        fail(r["error_kind"], r["error"])
    cap = f" of {show_bytes(r['capacity_bytes'])}" if r["capacity_bytes"] else ""
    echo_wrapped(f"{model} on {r['chip']} {r['version']} (precision {r['precision'] or 'as captured'}, batch {batch}; "
          "predicted by the plans' cost model)")
    echo_wrapped(f"prefill of {prompt} tokens (time to first token): {show_time(r['prefill_s'])}", indent="  ")
    echo_wrapped(f"decode at context {context}: {show_time(r['decode_s'])} per token, {r['tokens_per_s']:,.1f} tokens/s "
          f"({r['bound']}-bound, {100 * r['bound_share']:.0f}% of the step's time)", indent="  ")
    echo_wrapped(f"decode step memory: peak {show_bytes(r['peak_bytes'])}{cap}, KV cache {show_bytes(r['kv_cache_bytes'])}; "
          f"{r['fallbacks']} fallbacks to CPU", indent="  ")


def decode_text(model, res) -> str:
    rows, errors = [], []
    for r in res["rows"]:
        if r["ok"]:
            mem = show_bytes(r["peak_bytes"]) + (f" / {show_bytes(r['capacity_bytes'])}" if r["capacity_bytes"] else "")
            rows.append((r["chip"], r["version"], r["precision"] or "-", show_time(r["prefill_s"]), show_time(r["decode_s"]),
                         f"{r['tokens_per_s']:,.1f}", show_bytes(r["kv_cache_bytes"]), mem, r["fallbacks"],
                         f"{r['bound']} ({100 * r['bound_share']:.0f}%)"))
        else:
            errors += para(f"{r['chip']} {r['version']}: {r['error_kind']}: {r['error'].splitlines()[0]}",
                            indent="  ", subsequent="    ")
    out = para(f"{model}: batch {res['batch']}, prefill of {res['prompt']} tokens, decode at context "
                f"{res['context']} on {len(res['rows'])} chips, planned in {res['planning_s']:.1f} s (most tokens/s "
                "first; predicted)")
    out += text_table(rows, ("chip", "version", "precision", "prefill", "per token", "tokens/s", "KV cache",
                         "peak memory", "fallbacks", "decode bound by"), right=(3, 4, 5, 6, 8), optional=(1, 8))
    if errors:
        out.append(f"Not plannable ({sum(not r['ok'] for r in res['rows'])}):")
        out += errors
    return "\n".join(out)
