#!/usr/bin/env python
"""Cost-model calibration: does the planner's predicted time rank kernel calls as their
measured time does?

    python tools/calibrate.py [--json] [--cases resnet50_b8,bert_base_s512,bert_layer_s512] [--top 8]
                              [--runs 3] [--hcd FILE]
    python tools/calibrate.py --cases host_resnet50_b1,host_bert_layer_s128 [--hcd HOST.hcd] --top 0

The ``host_*`` cases plan float32 models (no precision policy) on this host's own HCD: the
file ``--hcd`` names, else a probe run first (``torchfl hcd probe --threads 1``, one thread's
CPU time like the points). ``--hcd`` also replaces the chip of every other case.

For each case the model is planned (fp16 policy) and its ``--top`` most expensive distinct
chip steps are taken (by predicted time; repeated layers counted once). Each step's points
are the chosen call and every priced alternative the plan rejected inside the step's nodes
(``plan.rejected[i].call``: kernel, inputs, layouts, attributes; partial covers included,
e.g. a conv without its batch-norm). Each point is run on the emulated chip on random
inputs of the plan's shapes (weights frozen, as the executor keeps them) and timed: the
least CPU time (``time.process_time``) of ``--runs`` calls after a warm-up, on ``--threads``
threads (default 1: on a shared host wall time swings several-fold with the other
processes' load, a single thread's CPU time does not).

Per kernel family (the catalog's ``family`` of each point's kernel):
``spearman``: rank correlation of predicted vs measured over all the family's points
(pooled over steps and cases; ties get averaged ranks);
``within_step_spearman``: its mean over steps with >= 3 points of distinct predicted time
(the ranking the planner actually uses: alternatives of one step against each other);
``tied_points``: points whose predicted time equals another point's of the same step (the
model says they cost the same; their measured order is the host's, see BENCHMARKS.md);
``mae_s``: mean |predicted - measured| in seconds (the chip's time against this CPU's: an
offset, not an error of the model alone); ``median_measured_over_predicted``.
``steps`` lists each step's own correlation (or why there is none: too few points, all
predicted equal); ``excluded`` the points not measured and why (an alternative the kernel
refuses on these inputs, a call already measured in the step); ``host_balanced_spearman``
the ranking of the same plans priced with this host's balance (:func:`host_balanced`).

``choice`` (:func:`choice`): does the planner pick what runs fastest? Per step, among the
chosen call and the alternatives that cover exactly the step's nodes (the same work: another
layout, another kernel for the same ops; partial covers are left out, their rest would run in
other steps), the step is *right* when the chosen call's measured time is within 10 % of the
fastest measured one; the alternatives also include the step's nodes split into measured partial
covers, summed (:func:`choice`). ``share`` is right steps / steps that had an alternative.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CASES = {
    # name: (zoo model, options, chip, precision policy); chip None: this host's probe HCD
    "resnet50_b8": ("resnet50", dict(batch=8, image=224), "NPU-V3", "float16"),
    "bert_base_s512": ("bert-base", dict(batch=1, seq_len=512), "TFL-X1", "float16"),
    # NPU-V3's 8 MiB cache: a BERT-large layer's 1024x4096 fp16 weights (8 MiB) do not fit, so
    # its GEMMs stream and their alternatives (linear vs fused epilogues) price differently
    "bert_layer_s512": ("bert-large", dict(batch=1, seq_len=512, layers=1), "NPU-V3", "float16"),
    # the host as the chip (issue 32): float32 as the models are written, on the probe's HCD
    "host_resnet50_b1": ("resnet50", dict(batch=1, image=224), None, None),
    "host_bert_layer_s128": ("bert-large", dict(batch=1, seq_len=128, layers=1), None, None),
}
CHOICE_TOLERANCE = 0.10


def ranks(xs):
    """1-based ranks, ties averaged: torchfl's one implementation (fidelity.score)."""
    from torchfl.fidelity.score import ranks as rank

    return rank(list(xs))


def spearman(a, b):
    """Spearman's rho (tie-averaged ranks) from two points on: torchfl's one implementation."""
    from torchfl.fidelity.score import spearman as rho

    return rho(list(a), list(b), min_pairs=2)


def _calls(plan, top):
    """(step, [(label, call dict, predicted_s, nodes)]) for the ``top`` most expensive distinct
    steps (all of them when ``top`` is 0)."""
    from torchfl.kernels.catalog import get

    steps = sorted((s for s in plan.steps if s.kind in ("kernel", "fused") and not s.static),
                   key=lambda s: -s.predicted_time_s)
    out, seen = [], set()
    for s in steps:
        shapes = tuple(tuple(plan.values[v].shape) if v in plan.values else () for v in s.inputs)
        sig = (s.kernel, shapes, s.layouts_in, repr(sorted(s.attrs.items())))
        if sig in seen:
            continue
        seen.add(sig)
        names = get(s.kernel).input_names
        chosen = {"kernel": s.kernel, "inputs": list(s.inputs), "kernel_inputs": list(names[:len(s.inputs)]),
                  "layouts_in": list(s.layouts_in), "attrs": dict(s.attrs), "dtype": s.dtype}
        points = [("chosen", chosen, s.predicted_time_s, tuple(s.nodes))]
        nodes = set(s.nodes)
        for r in plan.rejected:
            if r.call and r.predicted_time_s is not None and set(r.nodes) <= nodes:
                points.append((r.kernel, r.call, r.predicted_time_s, tuple(r.nodes)))
        out.append((s, points))
        if top and len(out) >= top:
            break
    return out


def _tensor(plan, name, layout, dtype, mem, static):
    import torch

    from torchfl.kernels import frozen
    from torchfl.kernels.tensor import DeviceTensor
    from torchfl.planner.plan import identity_layout

    val = plan.values.get(name)
    if val is not None:
        shape, want = tuple(val.shape), val.dtype
    else:   # a value inside a fused step (never materialised): its shape from the captured graph
        meta = _fx_values(plan).get(name)
        if meta is None:
            raise KeyError(f"value {name} is neither in the plan nor in the captured graph")
        shape, want = tuple(meta.shape), str(meta.dtype).replace("torch.", "")
    if want in ("float32", "float16", "bfloat16") and dtype in ("float16", "bfloat16"):
        want = dtype
    if want in ("int8", "int32", "int64", "bool"):
        x = torch.zeros(shape, dtype=torch.int64)
    else:
        x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 0.1
    lay = None if not layout or layout in ("A", identity_layout(len(shape))) else layout
    t = DeviceTensor.from_torch(x, mem, layout=lay, dtype=want)
    if static:
        frozen.freeze(t.buffer)
    return t


_FX: dict = {}


def _fx_values(plan):
    if id(plan) in _FX:
        return _FX[id(plan)]
    gm = plan.capture.graph_module if plan.capture else None
    vals = _FX[id(plan)] = {}
    for n in (gm.graph.nodes if gm is not None else ()):
        v = n.meta.get("val")
        if hasattr(v, "shape"):
            vals[n.name] = v
    return vals


def measure(plan, call, chip, mem, static_vals, runs):
    """(least CPU time of the kernel call on random inputs of the plan's shapes, its TilePlan)."""
    from torchfl.kernels.catalog import get

    spec = get(call["kernel"])
    ins = {}
    for kname, v, lay in zip(call["kernel_inputs"], call["inputs"], call["layouts_in"]):
        if v:
            ins[kname] = _tensor(plan, v, lay, call["dtype"], mem, v in static_vals)
    attrs = dict(call["attrs"])
    first = next((ins[n].dtype for n in spec.input_names if n in ins), None)
    prob = spec.problem({k: t.shape for k, t in ins.items()}, attrs, None if spec.mixed_dtypes else first,
                        {k: t.layout for k, t in ins.items()}, {k: t.dtype for k, t in ins.items()})
    tp = spec.tile(prob, chip)
    bound = spec.bind(chip, prob, tp, mem)
    times = []
    try:
        for i in range(runs + 1):
            t0 = time.process_time()
            outs, _ = bound(ins)
            dt = time.process_time() - t0
            for o in outs:
                o.free()
            if i:
                times.append(dt)
    finally:
        for t in ins.values():
            t.free()
    return min(times), tp


def _op_nodes(step) -> set:
    """The step's nodes that are ops: a tuple element read (FX names it ``getitem``,
    ``getitem_N``) is part of no alternative's cover."""
    return {n for n in step.nodes if n != "getitem" and not n.startswith("getitem_")}


def host_hcd(path=None, threads=1):
    """The host's HCD: the file at ``path``, else a probe of this host (one thread's CPU time)."""
    from torchfl.hcd import load_hcd

    if path:
        return load_hcd(path)
    from torchfl.fidelity.probe import probe

    return probe("cpu", threads=threads, timer="cpu" if threads == 1 else "wall").hcd()


def calibrate_case(name, top, runs, registry=None, hcd=None):
    import torch

    from torchfl.kernels.catalog import get
    from torchfl.kernels.memory import DeviceMemory
    from torchfl.kernels.tiling import simulated_time
    from torchfl.planner.api import plan_module
    from torchfl.planner.memory import static_steps
    from torchfl.planner.zoo import load_model

    zoo, kw, chip_name, precision = CASES[name]
    chip = hcd if hcd is not None else chip_name
    if chip is None:
        raise ValueError(f"case {name} plans on this host's HCD: pass --hcd FILE or let the tool probe")
    model, inputs = load_model(zoo, **kw)
    with torch.no_grad():
        plan = plan_module(model, inputs, chip, precision=precision, registry=None if hcd is not None else registry)
    chip = plan.target.model
    mem = DeviceMemory(chip)
    _steps, static_vals = static_steps(plan)
    points, skipped = [], []
    for step, alts in _calls(plan, top):
        done = set()
        for label, call, pred, cover in alts:
            key = json.dumps([call["kernel"], call["layouts_in"], call["inputs"], repr(call["attrs"])])
            if key in done:
                skipped.append({"case": name, "step": step.index, "kernel": call["kernel"], "label": label,
                                "why": "the same call as another point of this step (measured once)"})
                continue
            done.add(key)
            try:
                meas, tp = measure(plan, call, chip, mem, static_vals, runs)
            except Exception as exc:    # an alternative the kernel refuses on these inputs: say so
                skipped.append({"case": name, "step": step.index, "kernel": call["kernel"], "label": label,
                                "why": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            points.append({"case": name, "step": step.index, "family": get(call["kernel"]).family,
                           "kernel": call["kernel"], "label": label, "layouts_in": call["layouts_in"],
                           "cover": sorted(cover), "step_nodes": sorted(_op_nodes(step)),
                           "whole_step": set(cover) >= _op_nodes(step),
                           "predicted_s": pred, "measured_s": meas, "flops": tp.traffic.flops,
                           "bytes": tp.traffic.bytes, "compute_util": tp.compute_util,
                           "repriced_s": simulated_time(tp, chip, call["dtype"]),
                           "_host": (tp, chip, call["dtype"])})
    return points, skipped


def host_balanced(points):
    """The same tile plans priced with this host's balance instead of the chip's.

    The host's ceilings are the empirical roofline of the measured points (the best
    ops/s and the best counted bytes/s any point reached); each point's plan is then
    priced by the one formula (``simulated_time``) on its chip with those two numbers in
    place of the HCD's peak and off-chip bandwidth (cache, alignment, tiling unchanged).
    Where the chip is memory-bound and the host compute-bound, the chip's ranking and
    the host's differ by design; this says whether the formula ranks the host's times
    when given the host's numbers. Adds ``host_predicted_s`` to each point."""
    from dataclasses import replace

    from torchfl.kernels.tiling import simulated_time

    plans = [p.pop("_host") for p in points]
    live = [p for p in points if p["measured_s"] > 0]
    if not live:
        return {}
    top_f = max(live, key=lambda p: p["flops"] / p["measured_s"])
    top_b = max(live, key=lambda p: p["bytes"] / p["measured_s"])
    peak, bw = top_f["flops"] / top_f["measured_s"], top_b["bytes"] / top_b["measured_s"]
    for p, (tp, chip, dtype) in zip(points, plans):
        host = replace(chip, peak={d: peak for d in chip.peak}, offchip_bw=bw)
        p["host_predicted_s"] = simulated_time(tp, host, dtype) if peak > 0 and bw > 0 else None
    return {"peak_ops_per_s": peak, "peak_set_by": f"{top_f['case']} step {top_f['step']} {top_f['kernel']}",
            "offchip_bytes_per_s": bw, "bw_set_by": f"{top_b['case']} step {top_b['step']} {top_b['kernel']}"}


def _step_rows(ps):
    """Each step's own correlation over its points, or why there is none."""
    by_step = {}
    for p in ps:
        by_step.setdefault((p["case"], p["step"]), []).append(p)
    rows = []
    for (case, step), group in by_step.items():
        pred = [p["predicted_s"] for p in group]
        distinct = len(set(pred))
        rho = spearman(pred, [p["measured_s"] for p in group]) if distinct >= 2 else None
        why = None
        if len(group) < 2:
            why = "one point"
        elif distinct < 2:
            why = "all points predicted equal"
        rows.append({"case": case, "step": step, "points": len(group), "distinct_predicted": distinct,
                     "tied_points": sum(1 for x in pred if pred.count(x) > 1),
                     "spearman": rho, "why_none": why})
    return rows


def summarise(points):
    fams = {}
    for p in points:
        fams.setdefault(p["family"], []).append(p)
    out = {}
    for fam, ps in sorted(fams.items()):
        pred = [p["predicted_s"] for p in ps]
        meas = [p["measured_s"] for p in ps]
        steps = _step_rows(ps)
        within = [r["spearman"] for r in steps if r["distinct_predicted"] >= 3 and r["spearman"] is not None]
        ratios = [m / p for p, m in zip(pred, meas) if p > 0]
        rho = spearman(pred, meas)
        hp = [p.get("host_predicted_s") for p in ps]
        out[fam] = {"points": len(ps), "spearman": rho,
                    "host_balanced_spearman": spearman(hp, meas) if None not in hp else None,
                    "spearman_why_none": None if rho is not None else
                    ("fewer than 2 points" if len(ps) < 2 else "all points predicted (or measured) equal"),
                    "within_step_spearman": statistics.fmean(within) if within else None,
                    "within_step_groups": len(within),
                    "tied_points": sum(r["tied_points"] for r in steps),
                    "mae_s": statistics.fmean(abs(p - m) for p, m in zip(pred, meas)),
                    "median_measured_over_predicted": statistics.median(ratios) if ratios else None,
                    "steps": steps}
    return out


def _best_cover(nodes: frozenset, best: dict, memo: dict):
    """(least summed measured time, covers) of an exact partition of ``nodes`` into measured
    covers (``best``: cover -> (measured, label)); None where no partition exists."""
    if not nodes:
        return 0.0, ()
    if nodes in memo:
        return memo[nodes]
    first = min(nodes)
    out = None
    for cover, (t, label) in best.items():
        if first in cover and cover <= nodes:
            rest = _best_cover(nodes - cover, best, memo)
            if rest is not None and (out is None or t + rest[0] < out[0]):
                out = (t + rest[0], (label,) + rest[1])
    memo[nodes] = out
    return out


def choice(points, tolerance=CHOICE_TOLERANCE):
    """Does the plan pick the fastest measured way to run each step (within ``tolerance``)?

    Per step, the alternatives are every measured point covering the whole step (another
    layout, another kernel for the same ops) and every partition of the step's nodes into
    measured partial covers, summed (conv2d + batch_norm_infer + relu against the fused
    conv2d_bn_relu; each part at its fastest layout, conversions between them free: optimistic
    for the alternative, so the score is conservative). A step is *right* when the chosen
    call's measured time is within ``tolerance`` of the fastest alternative's."""
    by_step = {}
    for p in points:
        by_step.setdefault((p["case"], p["step"]), []).append(p)
    steps, right, single = [], 0, 0
    for (case, step), group in sorted(by_step.items()):
        chosen = next((p for p in group if p["label"] == "chosen"), None)
        if chosen is None:
            continue
        nodes = frozenset(chosen.get("step_nodes") or chosen.get("cover") or ())
        best = {}
        for p in group:
            if p is chosen:
                continue
            cover = frozenset(p.get("cover") or ()) & nodes if p.get("cover") else (nodes if p.get("whole_step") else None)
            if not cover:
                continue
            label = f"{p['kernel']} {','.join(l or '-' for l in p['layouts_in'])}"
            if cover not in best or p["measured_s"] < best[cover][0]:
                best[cover] = (p["measured_s"], label)
        alt = _best_cover(nodes, best, {}) if nodes else None
        if alt is None:
            single += 1
            continue
        fastest_s, parts = alt
        fastest_s = min(fastest_s, chosen["measured_s"])
        ok = chosen["measured_s"] <= fastest_s * (1 + tolerance)
        right += ok
        steps.append({"case": case, "step": step, "points": len(group), "right": ok,
                      "chosen": f"{chosen['kernel']} {','.join(l or '-' for l in chosen['layouts_in'])}",
                      "chosen_s": chosen["measured_s"],
                      "fastest": " + ".join(parts) if alt[0] <= chosen["measured_s"] else "the chosen call",
                      "fastest_s": fastest_s,
                      "chosen_over_fastest": chosen["measured_s"] / fastest_s if fastest_s else None})
    return {"tolerance": tolerance, "steps": len(steps), "right": right,
            "share": right / len(steps) if steps else None, "steps_with_one_point": single, "per_step": steps}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--top", type=int, default=8, help="distinct most expensive steps per case")
    ap.add_argument("--runs", type=int, default=3, help="timed calls per point (the minimum is kept)")
    ap.add_argument("--registry", default=None)
    ap.add_argument("--threads", type=int, default=1, help="kernel threads (CPU time is summed over them)")
    ap.add_argument("--hcd", default=None, help="plan every case on this HCD file (host_* cases: default a probe)")
    a = ap.parse_args(argv)
    import os

    os.environ["NUMBA_NUM_THREADS"] = str(a.threads)
    import warnings

    warnings.filterwarnings("ignore")
    from torchfl.cli.quiet import silence_import_noise

    silence_import_noise()          # torchao's and torch's import-time warnings (issue 36)
    points, skipped = [], []
    names = a.cases.split(",")
    for name in names:
        if name not in CASES:
            ap.error(f"unknown case {name!r}; choose from {', '.join(CASES)}")
    hcd = probe_hcd = None
    if a.hcd or any(CASES[n][2] is None for n in names):
        probe_hcd = host_hcd(a.hcd, a.threads)
        hcd_for = {n: probe_hcd if (a.hcd or CASES[n][2] is None) else None for n in names}
    else:
        hcd_for = {n: None for n in names}
    for name in names:
        ps, sk = calibrate_case(name, a.top, a.runs, a.registry, hcd_for[name])
        points += ps
        skipped += sk
    host = host_balanced(points)
    fams = summarise(points)
    picks = choice(points)
    chip_line = (f"{probe_hcd.chip.name} ({a.hcd or 'probed now'})" if probe_hcd is not None else None)
    if a.json:
        json.dump({"threads": a.threads, "timer": "process_time (min of runs)", "top": a.top, "families": fams,
                   "host_balance": host, "choice": picks, "host_hcd": chip_line, "points": points,
                   "excluded": skipped}, sys.stdout, indent=2)
        print()
        return 0
    if chip_line:
        print(f"host HCD: {chip_line}")
    if host:
        print(f"host balance: {host['peak_ops_per_s'] / 1e9:.1f} GFLOP/s ({host['peak_set_by']}), "
              f"{host['offchip_bytes_per_s'] / 1e9:.2f} GB/s ({host['bw_set_by']})")
    for fam, f in fams.items():
        rho = "-" if f["spearman"] is None else f"{f['spearman']:.3f}"
        wr = "-" if f["within_step_spearman"] is None else f"{f['within_step_spearman']:.3f}"
        hb = "-" if f["host_balanced_spearman"] is None else f"{f['host_balanced_spearman']:.3f}"
        print(f"{fam:<12} points {f['points']:3d}  spearman {rho} (host-balanced {hb})  "
              f"within-step {wr} ({f['within_step_groups']} steps)  "
              f"tied {f['tied_points']}  MAE {f['mae_s'] * 1e3:.3f} ms  "
              f"measured/predicted {f['median_measured_over_predicted']:.1f}")
        for r in f["steps"]:
            rr = f"{r['spearman']:.3f}" if r["spearman"] is not None else f"- ({r['why_none']})"
            print(f"    {r['case']} step {r['step']}: {r['points']} points, {r['distinct_predicted']} distinct "
                  f"predicted, {r['tied_points']} tied, spearman {rr}")
    for s in skipped:
        print(f"excluded: {s['case']} step {s['step']} {s['kernel']} ({s['label']}): {s['why']}")
    if picks["steps"]:
        print(f"choice: {picks['right']} of {picks['steps']} steps pick the fastest measured alternative or one "
              f"within {picks['tolerance']:.0%} ({picks['share']:.0%}); {picks['steps_with_one_point']} steps "
              "had no measured alternative")
        for r in picks["per_step"]:
            if not r["right"]:
                print(f"    {r['case']} step {r['step']}: chose {r['chosen']} {r['chosen_s'] * 1e3:.3f} ms, fastest "
                      f"{r['fastest']} {r['fastest_s'] * 1e3:.3f} ms ({r['chosen_over_fastest']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
