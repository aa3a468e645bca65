"""Planning a large language model without its weights: LLaMA-2 7B / 70B with their default
configs, built on the meta device, planned on a chip: the prefill of a short prompt and the
decode step at a context (KV cache included); wall time, peak RSS, fallbacks, fused groups.

    python tools/bench_lm_plan.py --size 7b --chip TFL-X1 [--context 4096] [--hcd FILE]
    python tools/bench_lm_plan.py --dp-scaling --hcd hcd_registry/mi300x.hcd

``--hcd`` plans on an HCD file instead of a registry chip (the real chips' descriptors).
``--dp-scaling``: the selection's (planner.select) seconds for prefill graphs of 4..80 LLaMA
layers, with the positions it searched, its largest state table and whether it was exact.
"""
from __future__ import annotations

import argparse
import os
import resource
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="7b", choices=["7b", "70b"])
    ap.add_argument("--chip", default="TFL-X1")
    ap.add_argument("--hcd", default=None, help="an HCD file to plan on (instead of --chip)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--dp-scaling", action="store_true", help="the selection's seconds against the node count")
    args = ap.parse_args(argv)
    if args.dp_scaling:
        return dp_scaling(args)

    t0 = time.perf_counter()
    from torchfl.hcd import load_hcd
    from torchfl.planner import plan_module, resolve_target, whatif
    from torchfl.planner.lm import llama

    target = resolve_target(load_hcd(args.hcd)) if args.hcd else resolve_target(args.chip)
    precision = whatif.auto_precision(target.hcd, "auto")
    model, inputs = llama(args.size)
    from torchfl.planner.errors import PlanError

    lines = []
    t1 = time.perf_counter()
    try:
        prefill = plan_module(model, inputs, chip=target, precision=precision)
        lines.append(f"  prefill of 8 tokens: planned in {time.perf_counter() - t1:.1f} s: "
                     f"{prefill.summary.headline(target.name)}; predicted {prefill.summary.predicted_time_s * 1e3:.3g} "
                     f"ms, peak {prefill.memory.peak_bytes / 2**30:.2f} GiB")
        del prefill     # one plan at a time, as the CLI keeps them: the RSS is planning's, not a pile of plans
        ok = True
    except PlanError as exc:    # refused (a 70B model's float16 weights do not fit an 80 GB chip)
        ok = False
        lines.append(f"  prefill refused after {time.perf_counter() - t1:.1f} s: {type(exc).__name__}: "
                     f"{str(exc)[:300]}")
    t2 = time.perf_counter()
    dec = whatif.Decoder(model)
    step = whatif.plan_decode(target, dec, 1, args.context, precision)
    t3 = time.perf_counter()
    if step.ok:
        s = step.plan.summary
        decode = (f"{s.headline(target.name)}; predicted {s.predicted_time_s * 1e3:.3g} ms/token, peak "
                  f"{step.peak_bytes / 2**30:.2f} GiB (KV cache {dec.cache_bytes(1, args.context) / 2**30:.2f} GiB)")
    else:
        decode = f"refused: {str(step.error)[:300]}"
    ok, step = ok and step.ok, None
    t3 = time.perf_counter()
    again = whatif.plan_decode(target, dec, 1, args.context + 1, precision)
    t4 = time.perf_counter()
    ok = ok and again.ok
    lines.append(f"  decode step at context {args.context}: captured and planned in {t3 - t2:.1f} s, the next context "
                 f"in {t4 - t3:.1f} s: {decode}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6   # kB -> GB
    print(f"LLaMA-2 {args.size} (meta device, default config) on {target.name} {target.version}, precision "
          f"{precision or 'as captured'}; load average {os.getloadavg()[0]:.1f}")
    print("\n".join(lines))
    print(f"  total {time.perf_counter() - t0:.1f} s (imports included), peak RSS {rss:.2f} GB")
    return 0 if ok else 1


def dp_scaling(args) -> int:
    """One prefill plan per depth; the selection timed around ``planner.select.select``."""
    from torchfl.hcd import load_hcd
    from torchfl.planner import plan_module, resolve_target
    from torchfl.planner import select as sel
    from torchfl.planner.errors import PlanError
    from torchfl.planner.lm import llama

    target = resolve_target(load_hcd(args.hcd)) if args.hcd else resolve_target(args.chip)
    real, seen = sel.select, []

    def timed(problem, *a, **k):
        t = time.perf_counter()
        s = real(problem, *a, **k)
        seen.append((s, time.perf_counter() - t))
        return s
    sel.select = timed
    for size, layers in [("7b", 4), ("7b", 8), ("7b", 16), ("7b", 32), ("70b", 80)]:
        model, inputs = llama(size, layers=layers)
        try:
            plan = plan_module(model, inputs, chip=target)
        except PlanError as exc:     # 70B float16 on an 80 GB chip: refused before the selection
            print(f"LLaMA-2 {size} {layers:3d} layers: refused, {str(exc)[:120]}")
            continue
        s, secs = seen[-1]
        print(f"LLaMA-2 {size} {layers:3d} layers: {len(s.order):5d} nodes, select {secs:6.2f} s, searched "
              f"{getattr(s, 'searched', len(s.order))}, max states {s.max_states}, exact {s.exact}, predicted "
              f"{plan.summary.predicted_time_s * 1e3:.4g} ms; load {os.getloadavg()[0]:.1f}", flush=True)
        del plan
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
