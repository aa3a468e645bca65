"""``--chips NxCHIP`` or ``--system NAME|FILE`` (with ``--tp``/``--pp``) on ``plan decode`` and
``plan memory``: a decoder LM split over N identical chips (:mod:`torchfl.planner.parallel`),
formatted. A system descriptor gives the chips and their links (``planner.parallel.systems``);
``--chips`` is its shorthand with the chip HCD's own links."""

from __future__ import annotations

import click

from torchfl.cli.whatif_cmd.common import echo_wrapped, emit_json, fail, para, show_bytes, show_time, text_table

CHIPS = click.option("--chips", default=None, metavar="NxCHIP",
                     help="N identical chips of one fabric domain, e.g. 8xH100-SXM5-80GB (the links from the "
                          "chip's HCD interconnect section); the model is split tensor/pipeline parallel.")
TP = click.option("--tp", type=click.IntRange(min=1), default=None, help="With --chips: tensor-parallel ways "
                                                                          "(default: chosen by cost).")
PP = click.option("--pp", type=click.IntRange(min=1), default=None, help="With --chips: pipeline stages "
                                                                          "(default: chosen by cost).")
EP = click.option("--ep", type=click.IntRange(min=1), default=None,
                  help="With --chips, a mixture-of-experts model: expert-parallel ways (each chip holds experts/ep "
                       "experts and runs batch/ep sequences; default: chosen by cost).")


SYSTEM = click.option("--system", default=None, metavar="NAME|FILE",
                      help="A system descriptor: a published system (torchfl system list), NAME@VERSION, or a "
                           "*.system.yaml file; its chips, topology and links (the system's overrides win). "
                           "--chips NxCHIP is the shorthand with the chip's own links.")


def chip_or_chips(chip, chips, tp, pp, system=None, ep=None) -> None:
    """Exactly one of --chip / --chips / --system; --tp/--pp/--ep only with several chips."""
    if sum(bool(x) for x in (chip, chips, system)) != 1:
        if system:
            fail("Error", "give --chip NAME (one chip), --chips NxNAME or --system NAME|FILE (several), exactly one")
        fail("Error", "give --chip NAME (one chip) or --chips NxNAME (several), not both or neither")
    if not (chips or system) and (tp or pp or ep):
        fail("Error", "--tp, --pp and --ep split a model over --chips NxCHIP; add --chips")


def run_parallel(model, module, chips, tp, pp, batch, context, prompt, precision, engine, registry, system=None,
                 ep=None):
    """The multi-chip plan of a decoder MODEL (plain data) over ``chips`` (NxCHIP) or ``system``
    (a system name or file); with a system, ``system`` in the result names it."""
    from torchfl.cli.whatif_cmd.common import decoder_of
    from torchfl.planner import whatif
    from torchfl.planner.parallel import parse_chips, plan_parallel

    if system:
        from torchfl.planner.parallel.systems import system_target

        st = system_target(system, registry)
        decoder_of(model, module, False, asked_by="--system")
        r = plan_parallel(module, st.target, st.count, batch, context, prompt, precision, engine, tp, pp, ep)
        return dict(r, system={"name": st.system.name, "version": st.system.version, "describe": st.label})
    spec = parse_chips(chips)
    decoder_of(model, module, False, asked_by="--chips")
    target = whatif.chip_of(spec.chip, registry)
    return plan_parallel(module, target, spec.count, batch, context, prompt, precision, engine, tp, pp, ep)


def _on(model, r) -> str:
    """The first words of an answer: which system it assumes."""
    if r.get("system"):
        return f"{model} on {r['system']['describe']}"
    return f"{model} on {r['chips']}x {r['chip']} {r['version']}"


def emit(model, r, as_json: bool, what: str) -> None:
    """Print a :func:`plan_parallel` result (``what``: decode or memory)."""
    if as_json:
        emit_json(dict(r, model=model))
        if not r["ok"]:
            raise SystemExit(1)
        return
    best = r["rows"][0]
    if not r["ok"]:
        click.echo("\n".join(para(f"{_on(model, r)}: no split fits")))
        click.echo(_table(r))
        fail(best.get("error_kind", "Error"), best.get("error", "no split fits"))
    cap = f" of {show_bytes(r['capacity_bytes'])}" if r["capacity_bytes"] else ""
    how = ("chosen by cost: smallest per-token latency that fits" if r["chosen_by"] == "cost"
           else "fixed by --tp/--pp" + ("/--ep" if best.get("ep", 1) > 1 else ""))
    echo_wrapped(f"{_on(model, r)} ({r['fabric']}, ring bus bandwidth "
                 f"{r['bus_gb_per_s']:.0f} GB/s; batch {r['batch']}, context {r['context']}; {r['assumes']}; "
                 "predicted by the plans' cost model)")
    ep = f" x expert parallel {best['ep']}" if best.get("ep", 1) > 1 else ""
    echo_wrapped(f"split: tensor parallel {best['tp']} x pipeline parallel {best['pp']}{ep} ({how})", indent="  ")
    experts = f", 1/{best['ep']} of the experts" if ep else ""
    echo_wrapped(f"memory per chip: peak {show_bytes(best['peak_bytes'])}{cap} (one stage's shard: "
                 f"{best['layers_per_stage']} layers, 1/{best['tp']} of each{experts}; KV cache "
                 f"{show_bytes(best['kv_cache_bytes'])} per chip)", indent="  ")
    if what == "decode":
        if best.get("prefill_s") is not None:
            echo_wrapped(f"prefill of {r['prompt']} tokens (time to first token): {show_time(best['prefill_s'])}",
                         indent="  ")
        echo_wrapped(f"decode at context {r['context']}: {show_time(best['decode_s'])} per token, "
                     f"{best['tokens_per_s']:,.1f} tokens/s ({best['bound']}-bound, {100 * best['bound_share']:.0f}% "
                     f"of the step); collectives {show_time(best['collective_s'])} = "
                     f"{100 * best['collective_share']:.1f}%{_calls(best)}; {best['fallbacks']} fallbacks", indent="  ")
        for kind, c in best["collectives"].items():
            echo_wrapped(f"{_KINDS[kind]}: {c['calls']} a step, {show_bytes(c['bytes_per_token'])} over the links per "
                         f"token, {show_time(c['seconds'])}", indent="    ")
    if len(r["rows"]) > 1:
        click.echo(_table(r))
    click.echo(f"  planned in {r['planning_s']:.1f} s")


_KINDS = {"all_reduce": "all-reduce (tp)", "all_gather": "all-gather of the logits (tp)",
          "p2p": "pipeline hand-off (pp)", "all_to_all": "all-to-all (ep)"}


def _calls(x) -> str:
    """`` (161 all-reduces of 16.00 KiB, 64 all-to-alls of 4.00 KiB blocks)``: the counts, or nothing."""
    parts = [f"{x['all_reduces']} all-reduces of {show_bytes(x['all_reduce_bytes'])}"] if x["all_reduces"] else []
    if x.get("all_to_alls"):
        parts.append(f"{x['all_to_alls']} all-to-alls of {show_bytes(x['all_to_all_block_bytes'])} blocks")
    return f" ({', '.join(parts)})" if parts else ""


def _split(x) -> str:
    return f"{x['tp']}x{x['pp']}" + (f"x{x['ep']}" if x.get("ep", 1) > 1 else "")


def _table(r) -> str:
    rows = []
    for x in r["rows"]:
        if x["ok"]:
            est = "~" if x["estimated"] else ""
            rows.append((_split(x), est + show_time(x["decode_s"]), show_time(x["collective_s"]),
                         est + show_bytes(x["peak_bytes"]), x["bound"]))
        else:
            rows.append((_split(x), "-", "-", "-", f"{x['error_kind']}: {x['error'][:70]}"))
    lines = ["  " + line for line in text_table(rows, ("tp x pp" + (" [x ep]" if any(x.get("ep", 1) > 1 for x in r["rows"]) else ""), "per token", "collectives", "peak per chip",
                                                      "bound"), right=(1, 2, 3), indent=2)]
    if any(x["ok"] and x["estimated"] for x in r["rows"]):
        lines += para("~ = estimated from the stage shard's plans at 1 and 2 layers (time and memory affine in "
                      "the layers); the chosen split is planned in full", indent="  ")
    return "\n".join(lines)


SYSTEMS = click.option("--systems", default=None, metavar="SYSTEM,...",
                       help="Comma-separated multi-chip systems, each a published system name (HGX-H100-8), a "
                            "*.system.yaml file or NxCHIP (8xA100-SXM4-80GB): a decoder (--context) split over "
                            "each, ranked by tokens/s; mutually exclusive with --chips.")


def compare_systems(model, module, systems, batch, context, prompt, precision, engine, registry) -> dict:
    """Each system of ``systems`` (comma-separated: system names or files, or NxCHIP) planned by
    :func:`run_parallel`, most tokens/s first (tokens/s per chip beside it); a system that cannot
    plan keeps its error."""
    import time

    from torchfl.hcd import TorchflInputError
    from torchfl.planner.errors import PlanError
    from torchfl.planner.parallel.split import _CHIPS
    from torchfl.registry.errors import NotFound

    t0 = time.perf_counter()
    rows = []
    for spec in [s.strip() for s in systems.split(",") if s.strip()]:
        is_chips = bool(_CHIPS.match(spec))
        try:
            r = run_parallel(model, module, spec if is_chips else None, None, None, batch, context, prompt, precision,
                             engine, registry, system=None if is_chips else spec)
        except PlanError as exc:
            rows.append({"system": spec, "ok": False, "error_kind": exc.kind, "error": str(exc).splitlines()[0]})
            continue
        except (NotFound, TorchflInputError) as exc:
            rows.append({"system": spec, "ok": False, "error_kind": "SystemError",
                         "error": str(exc).splitlines()[0]})
            continue
        best = r["rows"][0]
        row = {"system": spec, "ok": r["ok"], "chip": r["chip"], "version": r["version"], "chips": r["chips"],
               "split": r["split"], "result": r, "describe": (r.get("system") or {}).get("describe")}
        if r["ok"]:
            row.update(decode_s=best["decode_s"], tokens_per_s=best["tokens_per_s"],
                       tokens_per_s_per_chip=best["tokens_per_s"] / r["chips"], prefill_s=best.get("prefill_s"),
                       collective_share=best["collective_share"], peak_bytes=best["peak_bytes"],
                       bound=best["bound"], bound_share=best["bound_share"])
        else:
            row.update(error_kind=best.get("error_kind", "Error"), error=best.get("error", "no split fits"))
        rows.append(row)
    rows.sort(key=lambda x: (not x["ok"], -(x.get("tokens_per_s") or 0.0)))
    return {"rows": rows, "batch": batch, "context": context, "prompt": prompt,
            "planning_s": round(time.perf_counter() - t0, 3)}


def systems_text(model, res) -> str:
    rows, errors = [], []
    for r in res["rows"]:
        if r["ok"]:
            s = r["split"]
            rows.append((r["system"], _split(s), show_time(r["prefill_s"]) if r["prefill_s"] else "-",
                         show_time(r["decode_s"]), f"{r['tokens_per_s']:,.1f}", f"{r['tokens_per_s_per_chip']:,.2f}",
                         f"{100 * r['collective_share']:.1f}%", show_bytes(r["peak_bytes"]),
                         f"{r['bound']} ({100 * r['bound_share']:.0f}%)"))
        else:
            errors += para(f"{r['system']}: {r['error_kind']}: {r['error']}", indent="  ", subsequent="    ")
    out = para(f"{model}: batch {res['batch']}, prefill of {res['prompt']} tokens, decode at context {res['context']} "
               f"on {len(res['rows'])} systems, planned in {res['planning_s']:.1f} s (most tokens/s first; predicted; "
               "each system's split chosen by cost)")
    out += text_table(rows, ("system", "tp x pp", "prefill", "per token", "tokens/s", "tokens/s per chip",
                             "collectives", "peak per chip", "bound by"), right=(2, 3, 4, 5, 6, 7))
    if errors:
        out.append(f"Not plannable ({sum(not r['ok'] for r in res['rows'])}):")
        out += errors
    return "\n".join(out)
